"""One side of the GPU benchmark, alone in its process (so its peak memory is its own):
``python -m benchmarks.gpu.worker SIDE SPEC.json RESULT.json`` with SIDE ``rlvr`` or ``trl``.

The sides are the CPU benchmark's workers (``harness/worker_rlvr.py``: the real trainer's own
loop, ``Trainer.fit``, so its step counter and per-step seeds move as in a run;
``harness/worker_trl.py``: TRL's ``GRPOTrainer`` with phase timers), driven by a ``Recorder``
that has the runner's ``Gate`` interface without the turns: each side runs its steps back to
back on an otherwise idle GPU and stops after ``spec["steps"]`` (before rlvr's final save).

Peak GPU memory, the same way for both sides: the recorder resets torch.cuda's peak statistics
at every step boundary (the start of the first step, the end of each) and reads
``torch.cuda.max_memory_allocated`` at the step's end, so each record's ``peak_gpu_mb`` is that
step's own peak (model loading and start-up left out on both sides). rlvr's trainer also resets
the peak at its step's start (``training/memory.MemoryMeter``); that reset falls right after the
recorder's and changes nothing here. The benchmark takes the maximum over the measured steps.

``RLVR_GPU_BENCH_FAIL=SIDE`` makes that side's worker fail at once (exit 3), ``SIDE:hang`` hang
until killed: how the CPU rehearsal checks that a failed or timed-out side still leaves its tables. Needs ``PYTHONPATH`` with the
repository root and ``src``.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

FAIL_ENV = "RLVR_GPU_BENCH_FAIL"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class Recorder:
    """``protocol.Gate``'s interface: never blocks, keeps each step's record with its wall
    time (from the end of the previous step; the device synchronised at both ends) and, on a
    GPU, its peak allocated memory; says stop after ``steps`` steps."""

    def __init__(self, device: str, steps: int):
        self.device = device
        self.steps = steps
        self.info: dict = {}
        self.records: list[dict] = []
        self.stopped = False
        self._t0 = 0.0

    def _boundary(self) -> None:
        _sync(self.device)
        if self.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        self._t0 = time.perf_counter()

    def emit(self, kind: str, **data: Any) -> None:
        self.info.setdefault("events", []).append({"event": kind, **data})

    def start(self, **ready_info: Any) -> bool:
        self.info.update(ready_info)
        self._boundary()
        return True

    def step_done(self, record: dict) -> bool:
        _sync(self.device)
        now = time.perf_counter()
        record = {"wall_s": now - self._t0, **record}
        if self.device.startswith("cuda"):
            record["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
            record["peak_gpu_reserved_mb"] = torch.cuda.max_memory_reserved() / 2**20
        self.records.append(record)
        self.stopped = len(self.records) >= self.steps
        self._boundary()
        return not self.stopped


def run_rlvr(spec: dict, rec: Recorder) -> None:
    from benchmarks.harness.worker_rlvr import config_overrides, fit_gated
    from rlvr.config import load_config
    from rlvr.training.trainer import Trainer

    overrides = config_overrides(spec) + [
        f"model.device={spec['device']}",
        f"rollout.batch_size={spec['prompts_per_step'] * spec['group_size']}",
    ]
    trainer = Trainer(load_config(None, overrides), run_dir=Path(spec["work_dir"]) / "rlvr-run")
    if spec.get("padded"):
        # transformers' own SDPA: the update pads replies to the longest (packed_rows.can_pack
        # is false); decoding runs the same kernel either way (PACKED_SDPA delegates to it)
        trainer.model.set_attn_implementation("sdpa")
    fit_gated(
        trainer,
        rec,
        spec.get("side", "rlvr"),
        attention=trainer.model.config._attn_implementation,
    )


def run_trl(spec: dict, rec: Recorder) -> None:
    from benchmarks.harness.worker_trl import build_trainer

    trainer = build_trainer(spec, rec)
    rec.info["attention"] = trainer.model.config._attn_implementation
    trainer.train()


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("rlvr", "trl"):
        print(
            "usage: python -m benchmarks.gpu.worker rlvr|trl SPEC.json RESULT.json", file=sys.stderr
        )
        return 2
    side, spec = argv[0], json.loads(Path(argv[1]).read_text())
    name, _, how = os.environ.get(FAIL_ENV, "").partition(":")
    if name == spec.get("side", side):
        print(f"[gpu-worker] {name}: failure injected by {FAIL_ENV} ({how or 'exit'})", flush=True)
        while how == "hang":
            time.sleep(60)
        return 3
    device = spec["device"]
    torch.manual_seed(spec["seed"])
    rec = Recorder(device, spec["steps"])
    (run_rlvr if side == "rlvr" else run_trl)(spec, rec)
    result = {
        "side": side,
        "info": rec.info,
        "records": rec.records,
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    Path(argv[2]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
