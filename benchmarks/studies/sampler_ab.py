"""Does the hf engine's sampler change how fast the policy learns? An A/B over seeds.

    python -m benchmarks.studies.sampler_ab --seeds 0,1,2,3,4,5,6,7 --jobs 2

Runs the ``target`` workload (the settings ``benchmarks.step`` gives rlvr) once per seed and arm,
where the arms differ only in ``rollout.hf_decoder``: ``loop`` (rlvr's decoding loop) and
``generate`` (transformers' ``generate``). Both draw from the same distribution, so they must need
the same number of steps to reach the target reward, up to seed-to-seed chance; this measures
that chance and the difference. Steps to target do not depend on how busy the machine is, so
``--jobs`` runs several trainings at once (each with ``--threads`` threads; both arms get the
same, since the thread count changes the rounding and with it every trajectory).

Writes ``<out>/<date>-sampler-ab.{json,md,png}``: per run the per-step reward and reply length,
steps to target per seed and arm, the medians, and an exact permutation test of the difference
in mean steps (a run that never reaches the target counts as ``steps + 1``, which understates
how slow it was). Re-running on the same day with the same ``--out`` adds the new seeds.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from benchmarks.harness.seeds import parse_seeds
from benchmarks.harness.stats import rolling_mean, time_to_target
from benchmarks.harness.workloads import get_workload

ARMS = ("loop", "generate")
REPO = Path(__file__).resolve().parents[2]


def run_one(spec: dict) -> list[dict]:
    """Train one arm and seed until the target is reached or ``spec['steps']`` run out (or, with
    ``spec['stop_at_target']`` false, for all ``spec['steps']``); one record per step (in this
    process: the ``--run`` worker). The arm is ``spec['overrides']``, config overrides on top of
    the workload's; ``spec['metrics']`` names step metrics to keep beside the reward."""
    import torch

    from benchmarks.harness.worker_rlvr import config_overrides
    from rlvr.config import load_config
    from rlvr.training.trainer import Trainer

    torch.set_num_threads(spec["threads"])
    overrides = [*config_overrides(spec), *spec["overrides"], "train.save_every=0"]
    trainer = Trainer(load_config(None, overrides), run_dir=Path(spec["work_dir"]))
    records: list[dict] = []
    inner = trainer.train_step
    stop = spec.get("stop_at_target", True)

    class Reached(Exception):
        pass

    def step() -> dict:
        m = inner()
        comps = trainer.last_batch.completions
        records.append(
            {
                "step": len(records) + 1,
                "reward_mean": m["reward_mean"],
                "reply_len": sum(len(c.token_ids) for c in comps) / len(comps),
                "wall_s": m["time_step"],
                **{k: m[k] for k in spec.get("metrics", ()) if k in m},
            }
        )
        if stop and time_to_target(records, spec["target"], spec["window"]) is not None:
            raise Reached
        return m

    trainer.train_step = step
    with contextlib.suppress(Reached):
        trainer.fit()
    return records


def permutation_p(a: list[float], b: list[float]) -> float:
    """Two-sided exact permutation p-value of mean(a) - mean(b): the share of all ways to split
    the pooled values into groups of len(a) and len(b) whose difference is at least as large."""
    pooled, n = a + b, len(a)
    observed = abs(statistics.fmean(a) - statistics.fmean(b))
    total = sum(pooled)
    hits = count = 0
    for idx in itertools.combinations(range(len(pooled)), n):
        s = sum(pooled[i] for i in idx)
        diff = abs(s / n - (total - s) / len(b))
        hits += diff >= observed - 1e-12
        count += 1
    return hits / count


def steps_to_target(records: list[dict], target: float, window: int, cap: int) -> int:
    """First step whose trailing mean reaches the target; ``cap + 1`` when none does."""
    hit = time_to_target(records, target, window)
    return hit["step"] if hit else cap + 1


def summarize(runs: dict, target: float, window: int, cap: int) -> dict:
    """Steps to target per arm (seed order), medians, means and the permutation p-value."""
    seeds = sorted({int(s) for arm in runs.values() for s in arm})
    both = [s for s in seeds if all(str(s) in runs.get(a, {}) for a in ARMS)]
    steps = {a: [steps_to_target(runs[a][str(s)], target, window, cap) for s in both] for a in ARMS}
    out = {"seeds": both, "steps": steps, "not_reached_counts_as": cap + 1}
    if both:
        out["median"] = {a: statistics.median(steps[a]) for a in ARMS}
        out["mean"] = {a: statistics.fmean(steps[a]) for a in ARMS}
        out["p_value"] = permutation_p(steps["loop"], steps["generate"]) if len(both) > 1 else None
        out["reply_len_first_15"] = {
            a: statistics.fmean(r["reply_len"] for s in both for r in runs[a][str(s)][:15])
            for a in ARMS
        }
    return out


def _machine(m: dict) -> str:
    isa = "AVX512-BF16" if m["avx512_bf16"] else "no AVX512-BF16 (float32 path)"
    return f"{m['cpu']}, {m['cores']} cores, {isa}, {m['ram_gib']} GiB"


def write_report(path: Path, result: dict) -> None:
    s = result["summary"]
    lines = [
        "# Sampler A/B: rlvr's decoding loop vs transformers' generate",
        "",
        f"Machine: {_machine(result['machine'])}. Workload `target` (seeds {s['seeds']}), "
        f"{result['threads']} threads per run, {result['jobs']} runs at once. "
        f"Target: {result['window']}-step mean reward >= {result['target']} "
        f"(not reached in {result['cap']} steps counts as {s['not_reached_counts_as']}).",
        f"Command: `{result['command']}`",
        "",
        "| arm | steps to target per seed | median | mean | reply length, steps 1-15 |",
        "|---|---|---|---|---|",
    ]
    for a in ARMS:
        if s["seeds"]:
            lines.append(
                f"| {a} | {s['steps'][a]} | {s['median'][a]:g} | {s['mean'][a]:.1f} "
                f"| {s['reply_len_first_15'][a]:.1f} |"
            )
    if s.get("p_value") is not None:
        lines += ["", f"Exact permutation test, difference of means: p = {s['p_value']:.3f}."]
    path.write_text("\n".join(lines) + "\n")


def plot(
    path: Path,
    runs: dict,
    window: int,
    arms=ARMS,
    right: tuple[str, str, str] = (
        "reply_len",
        "mean reply length (tokens)",
        "reply length per run",
    ),
) -> None:
    """Every run's rolling-mean reward per step (left) and ``right`` = (record key, y label,
    title) per step (right), one colour per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_l) = plt.subplots(1, 2, figsize=(11, 4))
    key, ylabel, title = right
    for color, a in zip(("tab:blue", "tab:orange", "tab:green", "tab:red"), arms, strict=False):
        for i, (_seed, recs) in enumerate(sorted(runs.get(a, {}).items())):
            x = [r["step"] for r in recs]
            roll = rolling_mean([r["reward_mean"] for r in recs], window)
            label = a if i == 0 else None
            ax_r.plot(x, roll, color=color, alpha=0.6, label=label)
            ax_l.plot(x, [r.get(key) for r in recs], color=color, alpha=0.6, label=label)
    ax_r.set(xlabel="step", ylabel=f"reward, {window}-step mean", title="reward per run")
    ax_l.set(xlabel="step", ylabel=ylabel, title=title)
    for ax in (ax_r, ax_l):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.sampler_ab",
        description="Steps to the target reward with rlvr's decoding loop against transformers' "
        "generate, over seeds (the target workload, everything else equal).",
    )
    p.add_argument("--seeds", default="0,1,2,3,4,5,6,7", help="comma list (default 0-7)")
    p.add_argument("--jobs", type=int, default=2, help="trainings at once (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per training (default 1)")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--run", type=Path, help=argparse.SUPPRESS)  # worker mode: a spec file
    args = p.parse_args(argv)
    if args.jobs < 1 or args.threads < 1:
        p.error("--jobs and --threads must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.run:  # one training, in its own process
        spec = json.loads(args.run.read_text())
        records = run_one(spec)
        Path(spec["records"]).write_text(json.dumps(records))
        return 0
    from benchmarks.harness.machine import machine_info
    from benchmarks.step import prepare_model

    seeds = parse_seeds(args.seeds)
    w = get_workload("target")
    work = Path(tempfile.mkdtemp(prefix="sampler-ab-"))
    model_dir = prepare_model(w.model, work)
    stem = args.out / f"{dt.date.today().isoformat()}-sampler-ab"
    args.out.mkdir(parents=True, exist_ok=True)
    old = (
        json.loads(stem.with_suffix(".json").read_text())
        if stem.with_suffix(".json").exists()
        else {}
    )
    runs: dict = old.get("runs", {a: {} for a in ARMS})
    jobs = [(seed, arm) for seed in seeds for arm in ARMS if str(seed) not in runs.get(arm, {})]

    def launch(job: tuple[int, str]) -> tuple[int, str, list[dict]]:
        seed, arm = job
        d = work / f"{arm}-{seed}"
        d.mkdir()
        spec = {
            **w.worker_spec(model_dir, seed=seed, threads=args.threads, steps=w.steps),
            "overrides": [f"rollout.hf_decoder={arm}"], "engine": "hf", "target": w.target_reward, "window": w.target_window,
            "work_dir": str(d / "run"), "records": str(d / "records.json"),
        }  # fmt: skip
        (d / "spec.json").write_text(json.dumps(spec))
        cmd = [sys.executable, "-m", "benchmarks.studies.sampler_ab", "--run", str(d / "spec.json")]
        res = subprocess.run(
            cmd, cwd=REPO, capture_output=True, text=True, stdin=subprocess.DEVNULL
        )
        if res.returncode != 0:
            raise RuntimeError(f"{arm} seed {seed} failed:\n{res.stderr[-3000:]}")
        records = json.loads((d / "records.json").read_text())
        reached = time_to_target(records, w.target_reward, w.target_window)
        print(
            f"{arm:>8} seed {seed}: {'step ' + str(reached['step']) if reached else 'not reached'}",
            flush=True,
        )
        return seed, arm, records

    result = {
        "machine": machine_info(),
        "command": "python -m benchmarks.studies.sampler_ab " + " ".join(sys.argv[1:]),
        "threads": args.threads, "jobs": args.jobs, "target": w.target_reward,
        "window": w.target_window, "cap": w.steps, "runs": runs,
    }  # fmt: skip
    with ThreadPoolExecutor(args.jobs) as pool:
        # results are written as each run ends, so a cut-short A/B keeps what it finished
        for done in as_completed([pool.submit(launch, job) for job in jobs]):
            seed, arm, records = done.result()
            runs.setdefault(arm, {})[str(seed)] = records
            result["summary"] = summarize(runs, w.target_reward, w.target_window, w.steps)
            stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
            write_report(stem.with_suffix(".md"), result)
            plot(stem.with_suffix(".png"), runs, w.target_window)
    shutil.rmtree(work, ignore_errors=True)  # the run folders; every record is in the JSON
    print(stem.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
