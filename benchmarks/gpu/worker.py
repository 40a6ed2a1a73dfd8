"""One side of the GPU benchmark, alone in its process (so its peak memory is its own):
``python -m benchmarks.gpu.worker SIDE SPEC.json RESULT.json`` with SIDE ``rlvr`` or ``trl``.

The sides are the CPU benchmark's workers (``harness/worker_rlvr.py``: the real trainer;
``harness/worker_trl.py``: TRL's ``GRPOTrainer`` with phase timers), driven by a ``Recorder``
that has the runner's ``Gate`` interface without the turns: each side runs its steps back to
back on an otherwise idle GPU. Needs ``PYTHONPATH`` with the repository root and ``src``.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class Recorder:
    """``protocol.Gate``'s interface: never blocks, keeps each step's record with its wall
    time (from the end of the previous step; the device synchronised at both ends)."""

    def __init__(self, device: str):
        self.device = device
        self.info: dict = {}
        self.records: list[dict] = []
        self.stopped = False
        self._t0 = 0.0

    def emit(self, kind: str, **data: Any) -> None:
        self.info.setdefault("events", []).append({"event": kind, **data})

    def start(self, **ready_info: Any) -> bool:
        self.info.update(ready_info)
        _sync(self.device)
        self._t0 = time.perf_counter()
        return True

    def step_done(self, record: dict) -> bool:
        _sync(self.device)
        now = time.perf_counter()
        self.records.append({"wall_s": now - self._t0, **record})
        self._t0 = now
        return True


def run_rlvr(spec: dict, rec: Recorder) -> None:
    from benchmarks.harness.model_info import param_counts
    from benchmarks.harness.worker_rlvr import config_overrides, step_record
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
    import transformers

    rec.start(
        side="rlvr",
        versions={"torch": torch.__version__, "transformers": transformers.__version__},
        attention=trainer.model.config._attn_implementation,
        **param_counts(trainer.model),
    )
    try:
        for _ in range(spec["steps"]):
            metrics = trainer.train_step()
            rec.step_done(step_record(trainer, metrics))
    finally:
        trainer.run.close()


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
    device = spec["device"]
    torch.manual_seed(spec["seed"])
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    rec = Recorder(device)
    (run_rlvr if side == "rlvr" else run_trl)(spec, rec)
    result = {
        "side": side,
        "info": rec.info,
        "records": rec.records,
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if device.startswith("cuda"):
        result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
        result["peak_gpu_reserved_mb"] = torch.cuda.max_memory_reserved() / 2**20
    Path(argv[2]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
