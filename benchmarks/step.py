"""Side-by-side step benchmark, rlvr (transformers / vLLM rollouts) vs TRL's GRPOTrainer.

    python -m benchmarks.step --workload quick|default|long|target --steps N --out benchmarks/results/
    python -m benchmarks.step --sides rlvr,trl    # leave the vLLM side out

Sides: ``rlvr`` (rlvr's worker, ``rollout.engine=hf``, in ``.venv``), ``rlvr-vllm`` (the same
worker with ``rollout.engine=vllm``, in ``.venv-vllm``, made by ``make setup-vllm`` on first use)
and ``trl`` (in ``benchmarks/.venv-trl``, created on first use). Each side runs in its own process
on the same model folder, prompts, group size, token budget, dtype, algorithm, threads, lr and
seed. The processes stay alive and take turns (blocks of ``--block`` steps, ABBA order), so a
change in the machine's load hits all sides alike. See ``benchmarks/README.md`` for how to read
the output.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness.bounds import bound_summary
from benchmarks.harness.machine import (
    DTYPE_BYTES,
    PEAK_DTYPE,
    PRECISIONS,
    bench_precision,
    load_average,
    machine_info,
    matmul_peak_flops,
    memory_bandwidth,
)
from benchmarks.harness.report import render_markdown, write_results
from benchmarks.harness.runner import REPO, Worker, alternate, worker_env
from benchmarks.harness.seeds import over_seeds, parse_seeds
from benchmarks.harness.stats import side_ratios, summarize_side, time_to_target
from benchmarks.harness.trl_env import ensure_trl_env
from benchmarks.harness.vllm_env import DEFAULT_VENV as DEFAULT_VLLM_VENV
from benchmarks.harness.vllm_env import ensure_vllm_env
from benchmarks.harness.workloads import (
    WORKLOADS,
    check_workload,
    get_workload,
    prompt_digest,
    step_schedule,
)
from rlvr.allocator import CHOICES as ALLOCATORS
from rlvr.allocator import allocator_env

KNOWN_SIDES = ("rlvr", "rlvr-vllm", "trl", "trl-whole", "trl-gc")
DEFAULT_SIDES = "rlvr,rlvr-vllm,trl"
# the rollout engine of each rlvr side (the TRL side generates with transformers inside TRL)
RLVR_ENGINES = {"rlvr": "hf", "rlvr-vllm": "vllm"}
# TRL's two settings: "trl" trains on micro-batches with gradient accumulation (its memory-lean
# setting, the peer every ratio is taken against); "trl-whole" trains on the whole rollout batch
# in one pass (its fast setting, more activation memory). Opt-in: --sides rlvr,trl,trl-whole.
# Every TRL side runs without gradient checkpointing, as rlvr does (equal work: TRL's configs turn
# it on by default, so its update would recompute each forward); "trl-gc" is TRL with it on, its
# default, to show what the default costs. Opt-in: --sides rlvr,trl,trl-gc.
TRL_SIDES = ("trl", "trl-whole", "trl-gc")


def parse_sides(text: str) -> list[str]:
    """``"rlvr,trl"`` -> ``["rlvr", "trl"]`` (the order of turns); ValueError on a bad list."""
    sides = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in sides if s not in KNOWN_SIDES]
    if bad:
        raise ValueError(f"--sides={text!r}: unknown {bad}; known: {', '.join(KNOWN_SIDES)}")
    if not sides:
        raise ValueError(f"--sides={text!r}: no side given; known: {', '.join(KNOWN_SIDES)}")
    dup = sorted({s for s in sides if sides.count(s) > 1})
    if dup:
        raise ValueError(f"--sides={text!r}: {', '.join(dup)} given more than once")
    return sides


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.step", description=__doc__.split("\n")[0]
    )
    p.add_argument("--workload", default="quick", help=f"one of {', '.join(WORKLOADS)}")
    p.add_argument("--steps", type=int, default=None, help="steps per side (cap for 'target')")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--block", type=int, default=None, help="steps per turn (workload default)")
    p.add_argument("--warmup", type=int, default=None, help="steps left out of the figures")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=None, help="one seed (default: the workload's)")
    p.add_argument(
        "--seeds",
        default=None,
        help="comma list of seeds (e.g. 0,1,2,3,4): the whole side-by-side run once per seed, "
        "then steps and seconds to target as median [min-max] and a reward-vs-time plot "
        "(default: the workload's seeds; 0,1,2,3,4 for 'target'). Results are written after "
        "every seed, so a run cut short keeps the seeds it finished",
    )
    p.add_argument(
        "--sides",
        default=DEFAULT_SIDES,
        help=f"comma-separated subset of {DEFAULT_SIDES}, in the order of turns (default: all)",
    )
    p.add_argument("--trl-venv", type=Path, default=REPO / "benchmarks" / ".venv-trl")
    p.add_argument("--vllm-venv", type=Path, default=DEFAULT_VLLM_VENV)
    p.add_argument(
        "--no-install",
        action="store_true",
        help="fail instead of creating the TRL venv or running `make setup-vllm`",
    )
    p.add_argument(
        "--work-dir", type=Path, default=None, help="logs and run dirs (default: a temp dir)"
    )
    p.add_argument("--block-timeout", type=float, default=3600.0, help="seconds one block may take")
    p.add_argument(
        "--allocator",
        default="auto",
        choices=ALLOCATORS,
        help="malloc of the rlvr sides, as train.allocator: auto (default, what `rlvr train` "
        "does) preloads tcmalloc, else jemalloc, where the system has one",
    )
    p.add_argument(
        "--trl-allocator",
        default="system",
        choices=ALLOCATORS,
        help="malloc of the TRL sides: system (default, what TRL runs with), or the same "
        "choices as --allocator, to see what TRL would gain from it",
    )
    p.add_argument(
        "--precision",
        default="auto",
        choices=("auto", *PRECISIONS),
        help="what every side trains and generates in: auto (default) is bf16 on a CPU with a "
        "bf16 fast path (AVX512-BF16 or AMX) and float32 elsewhere, as rlvr's model.autocast=auto "
        "picks; the update is set against the matmul peak of this precision",
    )
    args = p.parse_args(argv)
    try:
        args.sides = parse_sides(args.sides)
    except ValueError as exc:
        p.error(str(exc))
    if args.threads < 1:
        p.error(f"--threads={args.threads}: must be >= 1")
    return args


def prepare_model(model: str, work: Path) -> Path:
    """The model folder both sides load: the embedded default or a freshly saved tiny model."""
    if model == "tiny":
        from rlvr.training.tiny import save_tiny_model

        return save_tiny_model(work / "tiny-model")
    from rlvr.model.loading import DEFAULT_MODEL, resolve_model_path

    return Path(resolve_model_path(DEFAULT_MODEL))


def prompts_agree(workers: dict[str, Worker], schedule: list[list[dict]]) -> bool:
    """True when every side trained step k on the prompts of step k of the schedule, with the
    same prompt token counts on every side (a tokenizer adding a BOS on one side would differ)."""
    expected = [prompt_digest([r["prompt"] for r in step]) for step in schedule]
    lens: list[list] = []
    for w in workers.values():
        digests = [r.get("prompt_digest") for r in w.steps]
        if digests != expected[: len(digests)]:
            return False
        lens.append([r.get("prompt_lens") for r in w.steps])
    n = min(len(x) for x in lens)
    return all(x[:n] == lens[0][:n] for x in lens)


def side_result(w: Worker, warmup: int, hw: dict, target: float | None, window: int) -> dict:
    """Summary figures of one side (warm-up shortened when a target run stopped early).

    ``hw`` holds the machine's measured ``peak_flops`` (matmul, in the run's precision), memory
    ``bandwidth`` (bytes/s) and ``dtype_bytes`` (2 for bf16, 4 for float32): the figures set each
    phase against its physical bound (``bounds.py``).
    """
    eff_warmup = min(warmup, max(0, len(w.steps) - 1))
    summary = summarize_side(w.steps, eff_warmup, w.ready, hw["peak_flops"])
    summary.update(
        bound_summary(
            w.steps[eff_warmup:],
            w.ready,
            hw["peak_flops"],
            hw["bandwidth"],
            dtype_bytes=hw["dtype_bytes"],
        )
    )
    summary["warmup_used"] = eff_warmup
    summary["peak_rss_mb"] = w.rss.peak / 2**20
    summary["startup_s"] = w.ready.get("startup_s")
    summary["threads"] = w.ready.get("threads")
    if target is not None:
        hit = time_to_target(w.steps, target, window)
        summary["time_to_target_s"] = hit["seconds"] if hit else None
        summary["time_to_target_step"] = hit["step"] if hit else None
    return {"summary": summary, "ready": w.ready, "done": w.done, "steps": w.steps}


def worker_command(
    side: str, python: Path, spec_path: Path, threads: int, allocator: str = "system"
) -> tuple[list[str], dict]:
    """The argv and environment of one side's worker process; ``allocator`` (a
    ``train.allocator`` value) is preloaded as ``rlvr train`` would (``rlvr.allocator``)."""
    if side in RLVR_ENGINES:
        # rlvr is installed (editable) in both .venv and .venv-vllm; only benchmarks/ is added
        argv = [str(python), "-m", "benchmarks.harness.worker_rlvr", str(spec_path)]
        env = worker_env(threads, [REPO])
    elif side in TRL_SIDES:
        argv = [str(python), "-m", "benchmarks.harness.worker_trl", str(spec_path)]
        env = worker_env(threads, [REPO, REPO / "src"])
    else:
        raise ValueError(f"unknown side {side!r}; known: {', '.join(KNOWN_SIDES)}")
    return argv, allocator_env(allocator, env)


def all_ratios(sides: dict[str, dict]) -> dict[str, dict]:
    """``{rlvr side: side_ratios(its summary, TRL's)}`` for every rlvr side; {} without TRL."""
    if "trl" not in sides:
        return {}
    trl = sides["trl"]["summary"]
    return {s: side_ratios(sides[s]["summary"], trl) for s in RLVR_ENGINES if s in sides}


def run_seed(
    args: argparse.Namespace,
    w,
    steps: int,
    block: int,
    warmup: int,
    pythons: dict,
    work: Path,
    model_dir: Path,
    tokenizer,
    seed: int,
    hw: dict,
) -> tuple[dict, bool]:
    """One side-by-side run with ``seed``: every side's result, and whether they saw the same
    prompts."""
    schedule = step_schedule(w, steps, tokenizer, seed)
    workers: dict[str, Worker] = {}
    try:
        for side in args.sides:
            spec = {
                **w.worker_spec(
                    model_dir,
                    seed=seed,
                    threads=args.threads,
                    steps=steps,
                    precision=hw["precision"],
                ),
                "work_dir": str(work / side),
                "schedule": schedule,
                "side": side,
            }
            if side == "trl-whole":
                spec["micro_batch"] = w.sequences
            if side == "trl-gc":
                spec["gradient_checkpointing"] = True
            if side in RLVR_ENGINES:
                spec["engine"] = RLVR_ENGINES[side]
            (work / side).mkdir(exist_ok=True)
            spec_path = work / f"{side}-spec.json"
            spec_path.write_text(json.dumps(spec))
            allocator = args.allocator if side in RLVR_ENGINES else args.trl_allocator
            argv_w, env = worker_command(side, pythons[side], spec_path, args.threads, allocator)
            worker = Worker(side, argv_w, env, work / f"{side}.log").start()
            workers[side] = worker
            # one side at a time even while loading, so start-up times are not shared
            worker.wait_ready(timeout_s=1800)
            engine = worker.ready.get("engine")
            print(
                f"[bench] {side} ready after {worker.ready['startup_s']:.1f} s"
                + (f" (rollout engine {engine})" if engine else ""),
                flush=True,
            )
        alternate(
            workers,
            steps=steps,
            block=block,
            target=w.target_reward,
            window=w.target_window,
            block_timeout_s=args.block_timeout,
            log=lambda msg: print(msg, flush=True),
        )
    finally:
        for worker in workers.values():
            worker.close()
    sides = {
        s: side_result(wk, warmup, hw, w.target_reward, w.target_window)
        for s, wk in workers.items()
    }
    return sides, prompts_agree(workers, schedule)


def pick_seeds(args: argparse.Namespace, w) -> list[int]:
    """``--seeds`` if given, else ``--seed``, else the workload's own seeds."""
    if args.seeds:
        return parse_seeds(args.seeds)
    if args.seed is not None:
        return [args.seed]
    return list(w.seeds)


def write_seed_results(
    args: argparse.Namespace,
    w,
    fixed: dict,
    seeds: list[int],
    per_seed: dict[str, dict],
    agree: list[bool],
    paths: tuple[Path, Path] | None,
) -> tuple[dict, tuple[Path, Path]]:
    """Write the results of the seeds run so far (called after every seed, so a run cut short
    keeps what it finished) to ``paths``, or to fresh file names the first time; returns the
    payload and the .json and .md paths."""
    load_start, load_end = fixed["load_average_start"], load_average()
    sides = per_seed[str(seeds[0])]
    notes = [
        "Training FLOPs = 6 x body parameters x (prompt + completion tokens) + 6 x LM-head "
        "parameters x completion tokens, real tokens only; achieved FLOP/s divides by the update "
        "phase's time.",
        "Times are medians over the steps after warm-up; token rates are totals over those steps "
        "divided by the phase's total time.",
    ]
    if len(per_seed) < len(seeds):
        notes.append(
            f"Partial: {len(per_seed)} of {len(seeds)} seeds done when this was written "
            f"({', '.join(per_seed)}); the run was still going or was stopped."
        )
    if load_start[0] > 0.5 or load_end[0] > 2.5:
        notes.append(
            f"The machine was not quiet (1-min load average {load_start[0]:.2f} at start, "
            f"{load_end[0]:.2f} at end; the benchmark itself runs {args.threads} thread(s)): "
            "absolute times are noisy; the ratios are fairer since the sides alternate."
        )
    if w.target_reward is not None:
        for seed, runs in per_seed.items():
            for s, res in runs.items():
                if res["summary"].get("time_to_target_s") is None:
                    notes.append(
                        f"{s} (seed {seed}) did not reach the target within "
                        f"{len(res['steps'])} steps (capped run)."
                    )
    payload = {
        **fixed,
        "date": time.strftime("%Y-%m-%d"),
        "time": time.strftime("%H:%M:%S"),
        "load_average_end": list(load_end),
        "prompts_match": all(agree),
        "sides": sides,
        "ratios": all_ratios(sides),
        "notes": notes,
    }
    if len(seeds) > 1:
        payload.update(
            seeds=seeds,
            seeds_done=[int(x) for x in per_seed],
            per_seed=per_seed,
            over_seeds=over_seeds(per_seed),
        )
    return payload, write_results(args.out, payload, paths)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        w = get_workload(args.workload)
        steps = args.steps if args.steps is not None else w.steps
        check_workload(w, steps)
    except ValueError as exc:
        print(f"[bench] {exc}", file=sys.stderr)
        return 2
    try:
        seeds = pick_seeds(args, w)
    except ValueError as exc:
        print(f"[bench] {exc}", file=sys.stderr)
        return 2
    block = args.block or w.block
    warmup = w.warmup if args.warmup is None else args.warmup
    if w.target_reward is None and warmup >= steps:
        print(f"[bench] --warmup={warmup} leaves no measured step of {steps}", file=sys.stderr)
        return 2
    # the venvs first: a missing one fails (or gets installed) before anything is measured
    pythons = {"rlvr": Path(sys.executable)}
    try:
        for side in (s for s in TRL_SIDES if s in args.sides):
            pythons[side] = ensure_trl_env(args.trl_venv, install=not args.no_install)
        if "rlvr-vllm" in args.sides:
            pythons["rlvr-vllm"] = ensure_vllm_env(args.vllm_venv, install=not args.no_install)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"[bench] {exc}", file=sys.stderr)
        return 2
    work = args.work_dir or Path(tempfile.mkdtemp(prefix=f"rlvr-bench-{w.name}-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"[bench] workload {w.name}, {steps} steps per side, logs in {work}", flush=True)

    load_start = load_average()
    from rlvr.model.precision import bf16_supported

    bf16_fast = bf16_supported("cpu")
    precision, why = bench_precision(args.precision, bf16_fast)
    # the bf16 peak only where bf16 is fast or used: emulated, one 2048^3 matmul takes minutes
    dtypes = ("bfloat16", "float32") if bf16_fast or precision == "bf16" else ("float32",)
    peaks = {dt: matmul_peak_flops(dtype=dt, threads=args.threads) / 1e9 for dt in dtypes}
    bandwidth = memory_bandwidth(threads=args.threads)
    print(
        f"[bench] precision {precision} ({why}); matmul peak "
        + ", ".join(f"{dt} {v:.0f} GFLOP/s" for dt, v in peaks.items())
        + f", memory bandwidth {bandwidth / 1e9:.1f} GB/s, load {load_start}",
        flush=True,
    )

    from transformers import AutoTokenizer

    model_dir = prepare_model(w.model, work)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    hw = {
        "peak_flops": peaks[PEAK_DTYPE[precision]] * 1e9,
        "bandwidth": bandwidth,
        "precision": precision,
        "dtype_bytes": DTYPE_BYTES[precision],
    }
    per_seed: dict[str, dict] = {}
    agree: list[bool] = []
    paths = None  # the first seed picks fresh file names; later seeds rewrite those files
    # the payload fields that do not change from seed to seed
    fixed = {
        "command": "python -m benchmarks.step " + shlex.join(argv),
        "workload": w.to_dict(),
        "model": "tiny (rlvr.training.tiny)" if w.model == "tiny" else "SmolLM2-135M-Instruct",
        "model_dir": str(model_dir),
        "steps": steps,
        "warmup": warmup,
        "block": block,
        "seed": seeds[0],
        "threads": args.threads,
        "machine": machine_info(),
        "load_average_start": list(load_start),
        "matmul_peak_gflops": peaks,
        "precision": precision,
        "precision_reason": why,
        "memory_bandwidth_gbs": bandwidth / 1e9,
        "work_dir": str(work),
    }
    for seed in seeds:
        if len(seeds) > 1:
            print(f"[bench] seed {seed}", flush=True)
        seed_work = work if len(seeds) == 1 else work / f"seed{seed}"
        seed_work.mkdir(parents=True, exist_ok=True)
        per_seed[str(seed)], same = run_seed(
            args, w, steps, block, warmup, pythons, seed_work, model_dir, tokenizer, seed, hw
        )
        agree.append(same)
        payload, paths = write_seed_results(args, w, fixed, seeds, per_seed, agree, paths)
    print(render_markdown(payload))
    print(f"[bench] wrote {paths[0]} and {paths[1]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
