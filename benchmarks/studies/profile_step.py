"""Profile one rlvr training step of a benchmark workload: where does the time go?

    python -m benchmarks.studies.profile_step --workload default --out /tmp/rlvr-profile

Runs the same trainer config as the benchmark's rlvr side, one warm-up step, then one step under
cProfile (Python call tree) and one under ``torch.profiler`` (operator table). Writes
``cprofile.txt``, ``torch_ops.txt`` and ``step_metrics.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import tempfile
from pathlib import Path

from benchmarks.harness.machine import PRECISIONS, bench_precision
from benchmarks.harness.worker_rlvr import config_overrides
from benchmarks.harness.workloads import WORKLOADS, get_workload
from benchmarks.step import prepare_model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.profile_step")
    p.add_argument("--workload", default="default", help=f"one of {', '.join(WORKLOADS)}")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=40, help="rows in each table")
    p.add_argument(
        "--precision",
        default="auto",
        choices=("auto", *PRECISIONS),
        help="as benchmarks.step: auto is bf16 where the CPU has a bf16 fast path, else float32",
    )
    args = p.parse_args(argv)
    w = get_workload(args.workload)
    import torch
    from torch.profiler import ProfilerActivity, profile

    from rlvr.config import load_config
    from rlvr.model.precision import bf16_supported
    from rlvr.training.trainer import Trainer

    precision, why = bench_precision(args.precision, bf16_supported("cpu"))
    print(f"[profile] precision {precision} ({why})", flush=True)

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rlvr-profile-"))
    spec = w.worker_spec(
        prepare_model(w.model, work), seed=0, threads=args.threads, steps=3, precision=precision
    )
    torch.set_num_threads(args.threads)
    trainer = Trainer(load_config(None, config_overrides(spec)), run_dir=work / "run")
    steps = [trainer.train_step()]  # warm-up: first-call allocations and lazy imports
    trainer.state.step += 1  # what the run loop does after each step

    prof = cProfile.Profile()
    prof.enable()
    steps.append(trainer.train_step())
    prof.disable()
    trainer.state.step += 1  # what the run loop does after each step
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(args.top)
    buf.write("\n\n---- by own time ----\n")
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.top)
    (out / "cprofile.txt").write_text(buf.getvalue())

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as tp:
        steps.append(trainer.train_step())
    table = tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top)
    (out / "torch_ops.txt").write_text(table)

    keep = ("time_", "response_len_mean", "gen_tokens_per_s", "train_tokens_per_s")
    summary = [{k: v for k, v in m.items() if k.startswith(keep)} for m in steps]
    (out / "step_metrics.json").write_text(json.dumps(summary, indent=1))
    trainer.run.close()
    print(json.dumps(summary, indent=1))
    print(f"[profile] wrote {out}/cprofile.txt, torch_ops.txt, step_metrics.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
