"""What the ``malloc`` is worth: the ``target`` workload's rlvr side under each allocator.

    python -m benchmarks.studies.allocator_ab --steps 10 --allocators system,tcmalloc,jemalloc

Each allocator (``train.allocator`` values, see ``rlvr.allocator``; ``system`` is glibc's) trains
the same seed in a process of its own, preloaded the way ``rlvr train`` preloads it, one after the
other (``--rounds 2``: a second round in reverse order, so neither always runs first). The
allocator changes no number the model computes, so every run trains on the same tokens: the
results say whether the per-step rewards agreed, and the step times and peak memory are then a
comparison on identical work. Figures are medians over the steps after ``--warmup``, peak RSS is
the process's own maximum (``ru_maxrss``), and each allocator is set against ``system`` measured
in the same invocation.

Writes ``<out>/<date>-allocators.{json,md}`` (every step record of every run).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness.machine import bench_precision, machine_info
from benchmarks.harness.report import results_paths
from benchmarks.harness.stats import safe_ratio
from benchmarks.harness.workloads import get_workload
from benchmarks.step import prepare_model
from rlvr.allocator import CHOICES, allocator_env, describe, resolve

REPO = Path(__file__).resolve().parents[2]
FIGURES = (  # (row label, record key, format)
    ("step time, median (s)", "step_s", "{:.2f}"),
    ("generation, median (s)", "generate_s", "{:.2f}"),
    ("update, median (s)", "update_s", "{:.2f}"),
)


def child(spec: dict) -> None:
    """Train ``spec['steps']`` steps of the target workload in this process, one JSON line a step."""
    import torch

    from benchmarks.harness.worker_rlvr import config_overrides
    from rlvr.config import load_config
    from rlvr.training.trainer import Trainer

    torch.set_num_threads(spec["threads"])
    trainer = Trainer(load_config(None, config_overrides(spec)), run_dir=Path(spec["work_dir"]))
    print(json.dumps({"allocator": describe()}), flush=True)
    for _ in range(spec["steps"]):
        t0 = time.perf_counter()
        m = trainer.train_step()
        trainer.state.step += 1  # what the run loop does after each step
        rec = {
            "step_s": time.perf_counter() - t0,
            "generate_s": m["time_rollout"],
            "update_s": m["time_update"],
            "reward_mean": m["reward_mean"],
            "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
        print(json.dumps(rec), flush=True)


def run_allocator(choice: str, spec: dict, work: Path) -> dict:
    """One training run under ``choice`` in a child process: what it had mapped, its steps."""
    spec_path = work / f"{choice}-spec.json"
    spec_path.write_text(json.dumps({**spec, "work_dir": str(work / f"run-{choice}")}))
    env = allocator_env(choice, {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.studies.allocator_ab", "--child", str(spec_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"allocator {choice}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return {"allocator": lines[0]["allocator"], "steps": lines[1:]}


def summarize(runs: list[dict], warmup: int) -> dict:
    """Medians over every run's steps after ``warmup`` and the largest peak RSS of the runs."""
    out = {}
    for _, key, _ in FIGURES:
        values = [s[key] for r in runs for s in r["steps"][warmup:]]
        out[key] = statistics.median(values) if values else None
    out["peak_rss_mb"] = max(s["maxrss_mb"] for r in runs for s in r["steps"])
    return out


def same_rewards(by_choice: dict[str, list[dict]]) -> bool:
    """Whether every run of every allocator saw the same per-step rewards (same tokens)."""
    seqs = {
        tuple(s["reward_mean"] for s in r["steps"]) for runs in by_choice.values() for r in runs
    }
    return len(seqs) == 1


def render(payload: dict) -> str:
    choices = payload["allocators"]
    summ = payload["summary"]
    peer = "system"
    ratio_cols = [c for c in choices if c != peer] if peer in choices else []
    cols = ["figure", *choices, *(f"{c}/{peer}" for c in ratio_cols)]
    rows = [*FIGURES, ("peak RSS (MB)", "peak_rss_mb", "{:.0f}")]
    lines = [
        f"# malloc A/B, workload `{payload['workload']}` ({payload['date']})",
        "",
        f"- Machine: {payload['machine']['cpu']}, {payload['machine']['cores']} cores; "
        f"precision {payload['precision']}; threads {payload['threads']}; seed {payload['seed']}",
        f"- {payload['steps']} steps per run, {payload['rounds']} round(s), first "
        f"{payload['warmup']} steps of each run left out of the medians",
        "- Libraries mapped: "
        + "; ".join(f"{c}: {', '.join(sorted(set(payload['mapped'][c])))}" for c in choices),
        f"- Same per-step rewards in every run: {'yes' if payload['same_rewards'] else 'NO'}",
        f"- Command: `{payload['command']}`",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for label, key, fmt in rows:
        cells = [fmt.format(summ[c][key]) if summ[c][key] is not None else "n/a" for c in choices]
        for c in ratio_cols:
            r = safe_ratio(summ[c][key], summ[peer][key])
            cells.append("n/a" if r is None else f"{r:.2f}")
        lines.append("| " + " | ".join([label, *cells]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.allocator_ab", description=__doc__
    )
    p.add_argument("--allocators", default="system,tcmalloc,jemalloc")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(json.loads(args.child.read_text()))
        return 0
    choices = [c.strip() for c in args.allocators.split(",") if c.strip()]
    bad = [c for c in choices if c not in CHOICES or c == "auto"]
    if bad or not choices:
        p.error(f"--allocators: {bad or 'none'}; choose among tcmalloc, jemalloc, system")
    for c in choices:
        resolve(c)  # a missing library fails here, naming the package, before any run
    if args.steps <= args.warmup:
        p.error(f"--steps={args.steps} must be above --warmup={args.warmup}")
    import torch

    from rlvr.model.precision import bf16_supported

    w = get_workload("target")
    precision, _ = bench_precision("auto", bf16_supported("cpu"))
    work = Path(tempfile.mkdtemp(prefix="rlvr-allocators-"))
    spec = w.worker_spec(
        prepare_model(w.model, work),
        seed=args.seed,
        threads=args.threads,
        steps=args.steps,
        precision=precision,
    )
    by_choice: dict[str, list[dict]] = {c: [] for c in choices}
    for r in range(args.rounds):
        for c in choices if r % 2 == 0 else reversed(choices):
            print(f"[allocators] round {r + 1}: {c}", flush=True)
            by_choice[c].append(run_allocator(c, spec, work))
    payload = {
        "workload": w.name,
        "date": dt.date.today().isoformat(),
        "machine": machine_info(),
        "precision": precision,
        "threads": args.threads,
        "torch": torch.__version__,
        "seed": args.seed,
        "steps": args.steps,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "allocators": choices,
        "command": "python -m benchmarks.studies.allocator_ab " + " ".join(sys.argv[1:]),
        "mapped": {c: [run["allocator"] for run in runs] for c, runs in by_choice.items()},
        "same_rewards": same_rewards(by_choice),
        "summary": {c: summarize(runs, args.warmup) for c, runs in by_choice.items()},
        "runs": by_choice,
    }
    md = render(payload)
    args.out.mkdir(parents=True, exist_ok=True)
    js_path, md_path = results_paths(args.out, payload["date"], "allocators")
    js_path.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    md_path.write_text(md)
    print(md)
    print(f"[allocators] wrote {js_path} and {md_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
