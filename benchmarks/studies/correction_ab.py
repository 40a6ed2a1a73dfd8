"""Which rollout correction should vLLM rollouts get by default? Arms over seeds.

    .venv-vllm/bin/python -m benchmarks.studies.correction_ab --seeds 0,1,2,3,4

Trains the ``target`` workload (the settings ``benchmarks.step`` gives rlvr) with
``rollout.engine=vllm`` once per seed and arm, where the arms differ only in
``algo.rollout_correction`` (docs/rollout.md, "Rollout correction"):

- ``off``: the ratio is taken against the trainer's own old log-probs; the engine's are ignored;
- ``token-truncate``: each token's weight min(exp(trainer - engine), cap) (TIS);
- ``sequence-truncate``: each sequence's ratio (the product of its token ratios) capped at cap;
- ``sequence-mask``: a sequence whose ratio (the product) leaves [1/cap, cap] gets weight 0, a
  kept one its ratio;
- ``geometric-reject``: a sequence whose geometric-mean ratio leaves [1/cap, cap] gets weight 0,
  a kept one 1 (what ``sequence-mask`` measured before the sequence level became the product).

The cap is the config's default (``algo.rollout_correction.cap``) unless ``--cap`` says otherwise.
Every run trains a fixed ``--steps`` (not stopped at the target), so each gives its steps and
seconds to the target (3-step mean reward 0.9), its final reward (mean of the last 5 steps: did
it hold?) and the engine/trainer log-prob gap it trained on. The arms of one seed share prompts
and sampling seeds, so each arm is compared with ``off`` seed by seed (sign test). Runs go one
at a time: vLLM's CPU engine and the trainer share the cores.

Writes ``<out>/<date>-correction-ab.{json,md,png}``, rewritten after every run. A study that
takes longer than one sitting goes on with ``--study PATH`` (an earlier day's JSON; by default
today's under ``--out``): it adds the seeds and arms that file lacks, and refuses when the file's
machine (CPU, cores, ISA limits), steps, threads, cap, code (``CODE``: rlvr, the workload, the worker) or the
overrides of an arm it has runs of differ from this call's (runs of different lengths, machines,
code or arms do not pool; files written before the code and the arms were recorded are not
checked for them). ``--any-code`` pools runs of other code all the same (a study that outlives
a session outlives commits too): each run's code state is recorded and the report counts them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import study_file
from benchmarks.harness.seeds import parse_seeds, sign_test
from benchmarks.harness.stats import time_to_target
from benchmarks.harness.study_file import code_line
from benchmarks.harness.workloads import get_workload
from benchmarks.studies.sampler_ab import plot

ARMS: dict[str, list[str]] = {
    "off": ["algo.rollout_correction.level=off"],
    "token-truncate": [
        "algo.rollout_correction.level=token",
        "algo.rollout_correction.action=truncate",
    ],
    "sequence-truncate": [
        "algo.rollout_correction.level=sequence",
        "algo.rollout_correction.action=truncate",
    ],
    "sequence-mask": [
        "algo.rollout_correction.level=sequence",
        "algo.rollout_correction.action=mask",
    ],
    "geometric-reject": [
        "algo.rollout_correction.level=geometric",
        "algo.rollout_correction.action=reject",
    ],
}
BASE = "off"
METRICS = (
    "logprob_diff_mean",
    "logprob_diff_max",
    "logprob_k3",
    "tis_weight_mean",
    "tis_truncated_frac",
    "tis_masked_frac",
)
FINAL = 5  # the final reward: mean of this many last steps
REPO = Path(__file__).resolve().parents[2]


def _mean(records: list[dict], key: str) -> float | None:
    xs = [float(r[key]) for r in records if r.get(key) is not None]
    return statistics.fmean(xs) if xs else None


def run_summary(records: list[dict], target: float, window: int) -> dict:
    """One run's figures: steps and seconds to the target (None: not reached), final reward,
    the log-prob gap (mean of the per-step mean |trainer - engine|, largest per-step max) and
    the correction's statistics averaged over steps."""
    hit = time_to_target(records, target, window)
    maxes = [float(r["logprob_diff_max"]) for r in records if "logprob_diff_max" in r]
    return {
        "steps": len(records),
        "steps_to_target": hit["step"] if hit else None,
        "seconds_to_target": hit["seconds"] if hit else None,
        "final_reward": statistics.fmean(r["reward_mean"] for r in records[-FINAL:]),
        "step_time_median_s": statistics.median(r["wall_s"] for r in records),
        "logprob_diff_mean": _mean(records, "logprob_diff_mean"),
        "logprob_diff_max": max(maxes) if maxes else None,
        "logprob_k3": _mean(records, "logprob_k3"),
        "tis_weight_mean": _mean(records, "tis_weight_mean"),
        "tis_truncated_frac": _mean(records, "tis_truncated_frac"),
        "tis_masked_frac": _mean(records, "tis_masked_frac"),
    }


def summarize(runs: dict, target: float, window: int) -> dict:
    """Per arm: each run's figures in seed order (seeds every arm ran), the medians, and the
    sign test of its steps to target against ``off``'s same-seed run (a miss counts as more)."""
    arms = [a for a in ARMS if a in runs]
    seeds = sorted({int(s) for a in arms for s in runs[a]})
    both = [s for s in seeds if all(str(s) in runs[a] for a in arms)]
    per = {a: [run_summary(runs[a][str(s)], target, window) for s in both] for a in arms}
    out: dict = {"seeds": both, "runs": per, "median": {}, "vs_off": {}}
    for a in arms:
        med = {}
        for key in ("steps_to_target", "seconds_to_target", "final_reward", "logprob_diff_mean"):
            vals = [r[key] for r in per[a] if r[key] is not None]
            med[key] = statistics.median(vals) if vals else None
        med["missed"] = sum(r["steps_to_target"] is None for r in per[a])
        out["median"][a] = med
        if a != BASE and BASE in per:
            out["vs_off"][a] = sign_test(
                [r["steps_to_target"] for r in per[a]], [r["steps_to_target"] for r in per[BASE]]
            )
    return out


def _fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def write_report(path: Path, result: dict) -> None:
    s = result["summary"]
    m = result["machine"]
    lines = [
        "# Rollout correction with vLLM rollouts: off and the correction arms",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB. Workload `target` with "
        f"`rollout.engine=vllm` (bf16 engine, trainer bf16 autocast over float32 weights), "
        f"{result['threads']} threads, {result['steps']} steps per run, one run at a time; "
        f"cap {result['cap']}. Target: {result['window']}-step mean reward >= {result['target']}. "
        f"Load average at start {result['load_start']}, now {result['load_now']}.",
        f"Command: `{result['command']}`",
        *code_line(result),
        "",
        "| arm | seed | steps to target | seconds to target | final reward (last 5) "
        "| log-prob gap, mean / max | weight mean | truncated | masked |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for a, runs in s["runs"].items():
        for seed, r in zip(s["seeds"], runs, strict=True):
            lines.append(
                f"| {a} | {seed} | {_fmt(r['steps_to_target'], 'd')} "
                f"| {_fmt(r['seconds_to_target'], '.0f')} | {r['final_reward']:.3f} "
                f"| {_fmt(r['logprob_diff_mean'], '.4f')} / {_fmt(r['logprob_diff_max'], '.3f')} "
                f"| {_fmt(r['tis_weight_mean'], '.4f')} | {_fmt(r['tis_truncated_frac'], '.4f')} "
                f"| {_fmt(r['tis_masked_frac'], '.4f')} |"
            )
    lines += [
        "",
        "| arm | steps to target, median | missed | seconds to target, median "
        "| final reward, median | fewer / equal / more steps than `off` (sign test p) |",
        "|---|---|---|---|---|---|",
    ]
    for a, med in s["median"].items():
        vs = s["vs_off"].get(a)
        cmp_ = f"{vs['fewer']} / {vs['equal']} / {vs['more']} (p = {vs['p']:.2f})" if vs else ""
        lines.append(
            f"| {a} | {_fmt(med['steps_to_target'], 'g')} | {med['missed']} "
            f"| {_fmt(med['seconds_to_target'], '.0f')} | {_fmt(med['final_reward'], '.3f')} "
            f"| {cmp_} |"
        )
    lines += ["", f"![reward per step, every run]({path.with_suffix('.png').name})"]
    path.write_text("\n".join(lines) + "\n")


# what a run of the study executes: rlvr, the workload and the worker that trains it
CODE = ("src", "benchmarks/harness", "benchmarks/step.py", "benchmarks/studies/sampler_ab.py")


def src_state(repo: Path) -> str | None:
    """The code a run of this study uses (``CODE``), as ``study_file.src_state`` hashes it."""
    return study_file.src_state(repo, CODE)


def check_compatible(old: dict, new: dict, path: Path, *, any_code: bool = False) -> None:
    """``study_file.check_compatible`` with this study's settings: steps, threads, cap."""
    study_file.check_compatible(old, new, path, keys=("steps", "threads", "cap"), any_code=any_code)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.correction_ab",
        description="Steps to the target reward, final reward and log-prob gap with vLLM "
        "rollouts under each rollout correction arm, over seeds. "
        "Run it with the vLLM venv's python (make setup-vllm).",
    )
    p.add_argument("--seeds", default="0,1,2,3,4", help="comma list (default 0-4)")
    p.add_argument("--arms", default=",".join(ARMS), help=f"subset of {', '.join(ARMS)}")
    p.add_argument("--steps", type=int, default=30, help="steps per run (default 30)")
    p.add_argument("--cap", type=float, default=None, help="algo.rollout_correction.cap")
    p.add_argument("--threads", type=int, default=2, help="torch threads per run (default 2)")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument(
        "--any-code",
        action="store_true",
        help="add to a --study whose runs used other code (src/, the workload, the worker); "
        "each run's code state is recorded and the report counts them",
    )
    p.add_argument(
        "--study",
        type=Path,
        default=None,
        help="the study JSON to add runs to (default <out>/<today>-correction-ab.json); "
        "its machine, steps, threads, cap, code (src/, benchmarks/harness) and arms' overrides must be this call's",
    )
    args = p.parse_args(argv)
    unknown = [a for a in args.arms.split(",") if a not in ARMS]
    if unknown:
        p.error(f"--arms: unknown {', '.join(unknown)}; known: {', '.join(ARMS)}")
    if args.steps < 1 or args.threads < 1:
        p.error("--steps and --threads must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("vLLM is not installed here: run with .venv-vllm/bin/python", file=sys.stderr)
        return 2
    from benchmarks.harness.machine import machine_info

    seeds, arms = parse_seeds(args.seeds), args.arms.split(",")
    w = get_workload("target")
    js = args.study or args.out / f"{dt.date.today().isoformat()}-correction-ab.json"
    stem = js.with_suffix("")
    js.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(js.read_text()) if js.exists() else {}
    runs: dict = old.get("runs", {})
    cap_args = [] if args.cap is None else [f"algo.rollout_correction.cap={args.cap}"]
    from rlvr.config import RolloutCorrectionConfig

    cap = args.cap if args.cap is not None else RolloutCorrectionConfig().cap
    result = {
        "machine": machine_info(),
        "command": "python -m benchmarks.studies.correction_ab " + " ".join(sys.argv[1:]),
        "threads": args.threads, "steps": args.steps, "cap": cap, "target": w.target_reward,
        "window": w.target_window, "load_start": round(os.getloadavg()[0], 2),
        "arms": {a: list(o) for a, o in ARMS.items()}, "src": src_state(REPO), "runs": runs,
        "run_src": old.get("run_src", {}),  # arm -> seed -> the code state its run used
    }  # fmt: skip
    check_compatible(old, result, js, any_code=args.any_code)
    work = Path(tempfile.mkdtemp(prefix="correction-ab-"))
    try:
        _run_all(args, seeds, arms, w, work, result, js, stem, cap_args)
    finally:  # the run folders (a failed run or Ctrl-C included); every record is in the JSON
        shutil.rmtree(work, ignore_errors=True)
    print(stem.with_suffix(".md").read_text())
    return 0


def _run_all(args, seeds, arms, w, work: Path, result: dict, js: Path, stem: Path, cap_args):
    from benchmarks.step import prepare_model

    runs = result["runs"]
    model_dir = prepare_model(w.model, work)
    # seed-major: a study cut short has every arm of the seeds it finished
    for seed in seeds:
        for arm in arms:
            if str(seed) in runs.get(arm, {}):
                continue
            d = work / f"{arm}-{seed}"
            d.mkdir()
            spec = {
                **w.worker_spec(model_dir, seed=seed, threads=args.threads, steps=args.steps),
                "engine": "vllm", "overrides": [*ARMS[arm], *cap_args], "metrics": list(METRICS),
                "stop_at_target": False, "target": w.target_reward, "window": w.target_window,
                "work_dir": str(d / "run"), "records": str(d / "records.json"),
            }  # fmt: skip
            (d / "spec.json").write_text(json.dumps(spec))
            cmd = [sys.executable, "-m", "benchmarks.studies.sampler_ab", "--run", str(d / "spec.json")]  # fmt: skip
            res = subprocess.run(
                cmd, cwd=REPO, capture_output=True, text=True, stdin=subprocess.DEVNULL
            )
            if res.returncode != 0:
                raise RuntimeError(f"{arm} seed {seed} failed:\n{res.stderr[-3000:]}")
            records = json.loads((d / "records.json").read_text())
            runs.setdefault(arm, {})[str(seed)] = records
            result["run_src"].setdefault(arm, {})[str(seed)] = result["src"]
            r = run_summary(records, w.target_reward, w.target_window)
            print(
                f"{arm:>15} seed {seed}: target at step {r['steps_to_target']}, final reward "
                f"{r['final_reward']:.3f}, gap {_fmt(r['logprob_diff_mean'], '.4f')}",
                flush=True,
            )
            result["load_now"] = round(os.getloadavg()[0], 2)
            result["summary"] = summarize(runs, w.target_reward, w.target_window)
            js.write_text(json.dumps(result, indent=1))
            write_report(stem.with_suffix(".md"), result)
            gap = ("logprob_diff_mean", "mean |trainer - engine| log-prob", "log-prob gap")
            plot(stem.with_suffix(".png"), runs, w.target_window, arms=list(ARMS), right=gap)


if __name__ == "__main__":
    sys.exit(main())
