"""Asynchrony that pays? The trainer on one core, the vLLM rollout worker on the other.

    .venv-vllm/bin/python -m benchmarks.studies.async_split --seeds 0,1,2,3,4

A 2-core machine as a two-device cluster: the ``target`` workload (the settings
``benchmarks.step`` gives rlvr) with ``rollout.mode=server``, the default rollout correction
(vLLM's: token truncation, cap 2), once per seed and arm, one run at a time:

- ``k0``: ``rollout.max_staleness=0`` (on-policy: each side idles while the other works);
- ``k1``, ``k2``: 1 and 2 batches generated ahead;
- ``k1-partial``: ``max_staleness=1`` with ``rollout.partial=true`` (a push pauses the generation
  in flight instead of waiting for it).

Pinning: one ``rlvr rollout-server`` for the whole study, started with its affinity set to the
worker core (``os.sched_setaffinity`` in the child before it execs, inherited by vLLM's engine
process) and ``VLLM_CPU_OMP_THREADS_BIND=<core>`` (vLLM's CPU backend binds its OpenMP threads
to these cores: one thread); each training runs in a process of its own pinned to the trainer
core with one torch thread (``torch.set_num_threads(1)``, ``train.threads=1``). Each trainer
connects with ``rollout.server_url`` and pushes its weights first, so the shared server holds
nothing of the previous run (prefix cache dropped at every push).

Per run: step time (median after the first step), generated tokens per second of wall time,
steps and seconds to the target (3-step mean reward 0.9), final reward (last 5 steps), per-token
version lag (mean, max), and the phases (trainer waiting for rollouts, generation, log-probs +
update, sync, push waiting for a generation). Each arm is compared with ``k0`` seed by seed
(seconds to target: ratio and sign test).

``--lora``: merged against adapter-only LoRA sync (``rollout.lora_sync``) on the 135M model,
rank 16 on every linear layer, vLLM in the trainer's process (both cores): sync seconds and
bytes per step. ``SHAPES`` gives the bytes one sync moves at Qwen2.5-7B and
gpt-oss-20b shapes, computed from their configs (``sync_bytes_table``), for docs/performance.md.

Writes ``<out>/<date>-async-split.{json,md,png}``, rewritten after every run; re-running on the
same day with the same ``--out`` adds the seeds and arms it lacks. A study longer than one sitting
(a run to the target takes most of an hour here) goes on with ``--study PATH`` (an earlier day's
JSON): it adds what that file lacks and refuses when its machine, steps, cores, code (``CODE``) or
an arm's overrides differ from this call's (``benchmarks/harness/study_file.py``; ``--any-code``
pools runs of other code, each run's code state recorded).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import study_file
from benchmarks.harness.seeds import parse_seeds, sign_test
from benchmarks.harness.stats import time_to_target
from benchmarks.harness.workloads import get_workload
from benchmarks.studies.sampler_ab import plot

SERVER = ["rollout.mode=server"]
ARMS: dict[str, list[str]] = {
    "k0": ["rollout.max_staleness=0"],
    "k1": ["rollout.max_staleness=1"],
    "k2": ["rollout.max_staleness=2"],
    "k1-partial": ["rollout.max_staleness=1", "rollout.partial=true"],
}
BASE = "k0"
METRICS = (
    "time_rollout",
    "time_generate",
    "time_logprobs",
    "time_update",
    "time_sync",
    "time_wait_ahead",
    "staleness_mean",
    "token_lag_mean",
    "token_lag_max",
    "sync_bytes",
    "sync_seconds",
)
PHASES = {  # where a step's time went (medians over steps after the first)
    "wait_rollout": ("time_rollout",),
    "generate": ("time_generate",),
    "logprobs_update": ("time_logprobs", "time_update"),
    "sync": ("time_sync",),
    "wait_push": ("time_wait_ahead",),
}
FINAL = 5
REPO = Path(__file__).resolve().parents[2]
# what a run of the study executes: rlvr, the workload, the worker and this file's pinning
CODE = (
    "src",
    "benchmarks/harness",
    "benchmarks/step.py",
    "benchmarks/studies/sampler_ab.py",
    "benchmarks/studies/async_split.py",
)
LORA_ARMS = {"merged": ["rollout.lora_sync=merged"], "adapter": ["rollout.lora_sync=adapter"]}
LORA_RANK = 16
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# Hand-copied from each model's config.json on the Hugging Face hub (the fields that set the
# weight shapes); ``source`` names the file. The biases are the architectures' (transformers'
# modeling code: Qwen2 has q/k/v biases, gpt-oss ``attention_bias: true`` on all four and
# biased experts, Llama none). ``total_params`` gives 134,515,008, 7,615,616,512 and
# 20,914,757,184 for the three: the models' published parameter counts.
SHAPES: dict[str, dict] = {
    "SmolLM2-135M": {
        "source": "HuggingFaceTB/SmolLM2-135M-Instruct/config.json",
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "vocab_size": 49152, "tie_word_embeddings": True, "qkv_bias": False, "o_bias": False,
    },
    "Qwen2.5-7B": {
        "source": "Qwen/Qwen2.5-7B/config.json",
        "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "head_dim": 128,
        "vocab_size": 152064, "tie_word_embeddings": False, "qkv_bias": True, "o_bias": False,
    },
    "gpt-oss-20b": {
        "source": "openai/gpt-oss-20b/config.json",
        "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 24,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
        "vocab_size": 201088, "tie_word_embeddings": False, "qkv_bias": True, "o_bias": True,
        "num_local_experts": 32,
    },
}  # fmt: skip


# ---------------------------------------------------------------------- computed sync bytes
def linear_shapes(shape: dict) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear layer of one decoder block; an MoE's MLP is its experts' (one
    gate_up and one down per expert: ``experts.gate_up_proj`` is in x 2 x intermediate)."""
    h, d = shape["hidden_size"], shape["head_dim"]
    q, kv = shape["num_attention_heads"] * d, shape["num_key_value_heads"] * d
    out = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
    i = shape["intermediate_size"]
    if "num_local_experts" in shape:
        out |= {"gate_up_proj": (h, 2 * i), "down_proj": (i, h)}
    else:
        out |= {"gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    return out


def total_params(shape: dict) -> int:
    """Every weight a full sync sends: embeddings (and an untied head), per block the linears
    (with their biases), per-expert MLPs, the router and attention sinks of
    an MoE, the two norms; the final norm. The tied head is not sent (rlvr skips it)."""
    h, v = shape["hidden_size"], shape["vocab_size"]
    experts = shape.get("num_local_experts", 1)
    block = 2 * h  # input and post-attention norms
    for name, (i, o) in linear_shapes(shape).items():
        n = experts if name in ("gate_up_proj", "down_proj") and experts > 1 else 1
        bias = {"q_proj": "qkv_bias", "k_proj": "qkv_bias", "v_proj": "qkv_bias"}.get(name)
        has = shape[bias] if bias else shape["o_bias"] if name == "o_proj" else experts > 1
        block += n * (i * o + (o if has else 0))
    if experts > 1:
        block += h * experts + experts + shape["num_attention_heads"]  # router (+bias), sinks
    embed = v * h * (1 if shape["tie_word_embeddings"] else 2)
    return embed + shape["num_hidden_layers"] * block + h


def lora_params(shape: dict, rank: int, modules: tuple[str, ...]) -> int:
    """A (rank x in) and B (out x rank) of every adapted linear, all blocks; per expert for an
    MoE's expert layers."""
    experts = shape.get("num_local_experts", 1)
    per_block = 0
    for name, (i, o) in linear_shapes(shape).items():
        if name in modules:
            n = experts if name in ("gate_up_proj", "down_proj") and experts > 1 else 1
            per_block += n * rank * (i + o)
    return shape["num_hidden_layers"] * per_block


def sync_bytes_table(rank: int = LORA_RANK, bytes_per_value: int = 2) -> list[dict]:
    """Per shape: bytes of a full (merged) bf16 sync and of adapter-only syncs at ``rank`` on the
    attention projections and on every linear layer (an MoE's experts included)."""
    rows = []
    for name, shape in SHAPES.items():
        full = total_params(shape) * bytes_per_value
        attn = lora_params(shape, rank, LINEAR[:4]) * bytes_per_value
        every = lora_params(shape, rank, tuple(linear_shapes(shape))) * bytes_per_value
        rows.append(
            {"model": name, "source": shape["source"], "full_bytes": full,
             "adapter_attention_bytes": attn, "adapter_all_linear_bytes": every,
             "attention_share": attn / full, "all_linear_share": every / full}
        )  # fmt: skip
    return rows


# ---------------------------------------------------------------------- summaries
def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def run_summary(records: list[dict], target: float, window: int, sequences: int) -> dict:
    """One run: steps/seconds to the target, final reward, step time and phases (medians after
    step 1, which has no batch ahead), tokens per second of wall time, the lag per token."""
    hit = time_to_target(records, target, window)
    later = records[1:] or records
    lags = [r["token_lag_mean"] for r in records if r.get("token_lag_mean") is not None]
    maxes = [r["token_lag_max"] for r in records if r.get("token_lag_max") is not None]
    # on-policy (k0) logs no time_generate: its generation is the trainer's wait, time_rollout
    phases = {
        name: _median(
            [sum(float(r.get(k, r.get("time_rollout", 0.0) if k == "time_generate" else 0.0))
                 for k in keys) for r in later]
        )
        for name, keys in PHASES.items()
    }  # fmt: skip
    tokens = sum(float(r["reply_len"]) * sequences for r in records)
    return {
        "steps": len(records),
        "steps_to_target": hit["step"] if hit else None,
        "seconds_to_target": hit["seconds"] if hit else None,
        "final_reward": statistics.fmean(r["reward_mean"] for r in records[-FINAL:]),
        "step_time_median_s": _median([float(r["wall_s"]) for r in later]),
        "tokens_per_s": tokens / sum(float(r["wall_s"]) for r in records),
        "token_lag_mean": statistics.fmean(lags) if lags else None,
        "token_lag_max": max(maxes) if maxes else None,
        "phases_s": phases,
    }


def summarize(runs: dict, target: float, window: int, sequences: int) -> dict:
    """Per arm over the seeds every arm ran: each run's figures, medians, and against ``k0`` the
    median ratio of seconds to target (seed by seed), the final reward difference and the sign
    test of seconds to target (a miss counts as more)."""
    arms = [a for a in ARMS if a in runs]
    seeds = sorted({int(s) for a in arms for s in runs[a]})
    both = [s for s in seeds if all(str(s) in runs[a] for a in arms)]
    per = {a: [run_summary(runs[a][str(s)], target, window, sequences) for s in both] for a in arms}
    out: dict = {"seeds": both, "runs": per, "median": {}, "vs_k0": {}}
    keys = ("seconds_to_target", "steps_to_target", "final_reward", "step_time_median_s")
    for a in arms:
        med = {k: _median([r[k] for r in per[a] if r[k] is not None]) for k in keys}
        med["tokens_per_s"] = _median([r["tokens_per_s"] for r in per[a]])
        med["token_lag_mean"] = _median(
            [r["token_lag_mean"] for r in per[a] if r["token_lag_mean"] is not None]
        )
        med["missed"] = sum(r["steps_to_target"] is None for r in per[a])
        out["median"][a] = med
        if a == BASE or BASE not in per:
            continue
        ratios = [
            r["seconds_to_target"] / b["seconds_to_target"]
            for r, b in zip(per[a], per[BASE], strict=True)
            if r["seconds_to_target"] is not None and b["seconds_to_target"] is not None
        ]
        out["vs_k0"][a] = {
            "time_ratio_median": _median(ratios),
            "final_reward_diff_median": _median(
                [
                    r["final_reward"] - b["final_reward"]
                    for r, b in zip(per[a], per[BASE], strict=True)
                ]
            ),
            "sign": sign_test(
                [r["seconds_to_target"] for r in per[a]],
                [b["seconds_to_target"] for b in per[BASE]],
            ),
        }
    return out


def lora_summary(lora_runs: dict) -> dict:
    """Per LoRA sync arm: median sync seconds and bytes per step, step time."""
    out = {}
    for arm, records in lora_runs.items():
        out[arm] = {
            "sync_seconds_median": _median([r["sync_seconds"] for r in records if "sync_seconds" in r]),
            "sync_bytes_median": _median([r["sync_bytes"] for r in records if "sync_bytes" in r]),
            "step_time_median_s": _median([r["wall_s"] for r in records[1:] or records]),
        }  # fmt: skip
    return out


# ---------------------------------------------------------------------- report
def _fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB" if n < 1e9 else f"{n / 1e9:,.2f} GB"


def write_report(path: Path, result: dict) -> None:
    m = result["machine"]
    lines = [
        "# Asynchrony on a split machine: trainer on one core, rollout worker on the other",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB; trainer on core "
        f"{result['cores'][0]} (1 torch thread), vLLM server on core {result['cores'][1]} "
        f"(affinity + VLLM_CPU_OMP_THREADS_BIND). Workload `target`, `rollout.mode=server`, "
        f"the default rollout correction, {result['steps']} steps per run, one run at a time. "
        f"Target: {result['window']}-step mean reward >= {result['target']}. Load average at "
        f"start {result['load_start']}, now {result.get('load_now')}.",
        f"Command: `{result['command']}`",
        *study_file.code_line(result),
        "",
    ]
    s = result.get("summary")
    if s and s["seeds"]:
        lines += [
            "| arm | seed | steps to target | seconds to target | final reward | step time, "
            "median s | tokens/s | token lag mean / max | wait rollout / generate / "
            "logprobs+update / sync / wait push, median s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for a, runs in s["runs"].items():
            for seed, r in zip(s["seeds"], runs, strict=True):
                ph = " / ".join(_fmt(v, ".1f") for v in r["phases_s"].values())
                lines.append(
                    f"| {a} | {seed} | {_fmt(r['steps_to_target'], 'd')} "
                    f"| {_fmt(r['seconds_to_target'], '.0f')} | {r['final_reward']:.3f} "
                    f"| {_fmt(r['step_time_median_s'], '.1f')} | {r['tokens_per_s']:.1f} "
                    f"| {_fmt(r['token_lag_mean'], '.2f')} / {_fmt(r['token_lag_max'], 'g')} "
                    f"| {ph} |"
                )
        lines += [
            "",
            "| arm | seconds to target, median | missed | time vs k0, median ratio | final "
            "reward, median (diff vs k0) | faster / equal / slower than k0 (sign test p) |",
            "|---|---|---|---|---|---|",
        ]
        for a, med in s["median"].items():
            vs = s["vs_k0"].get(a)
            sign = vs["sign"] if vs else None
            lines.append(
                f"| {a} | {_fmt(med['seconds_to_target'], '.0f')} | {med['missed']} "
                f"| {_fmt(vs and vs['time_ratio_median'], '.2f')} "
                f"| {_fmt(med['final_reward'], '.3f')} "
                f"({_fmt(vs and vs['final_reward_diff_median'], '+.3f')}) "
                + (
                    f"| {sign['fewer']} / {sign['equal']} / {sign['more']} (p = {sign['p']:.2f}) |"
                    if sign
                    else "| |"
                )
            )
        lines += ["", f"![reward and token lag per step]({path.with_suffix('.png').name})"]
    if result.get("lora"):
        lines += [
            "",
            f"## LoRA sync on the 135M model (rank {LORA_RANK}, every linear layer, vLLM in the "
            "trainer's process, both cores)",
            "",
            "| sync | seconds per sync, median | bytes per sync | step time, median s |",
            "|---|---|---|---|",
        ]
        for arm, r in result["lora"]["summary"].items():
            lines.append(
                f"| {arm} | {_fmt(r['sync_seconds_median'], '.3f')} "
                f"| {_fmt(r['sync_bytes_median'], ',.0f')} | {_fmt(r['step_time_median_s'], '.1f')} |"
            )
    lines += [
        "",
        f"## Bytes one sync moves, computed from the configs (bf16, LoRA rank {LORA_RANK})",
        "",
        "| model | full (merged) sync | adapter, q/k/v/o | adapter, every linear | source |",
        "|---|---|---|---|---|",
    ]
    for r in result["sync_bytes"]:
        lines.append(
            f"| {r['model']} | {_mb(r['full_bytes'])} | {_mb(r['adapter_attention_bytes'])} "
            f"({r['attention_share']:.2%}) | {_mb(r['adapter_all_linear_bytes'])} "
            f"({r['all_linear_share']:.2%}) | `{r['source']}` |"
        )
    path.write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------------- running
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.async_split",
        description="max_staleness 0/1/2 and partial rollouts with the trainer and the vLLM "
        "rollout worker on separate cores; merged vs adapter-only LoRA sync. Run it with the "
        "vLLM venv's python on an otherwise idle machine.",
    )
    p.add_argument("--seeds", default="0,1,2,3,4", help="comma list (default 0-4)")
    p.add_argument("--arms", default=",".join(ARMS), help=f"subset of {', '.join(ARMS)}")
    p.add_argument("--steps", type=int, default=40, help="steps per run (default 40)")
    p.add_argument("--cores", default="0,1", help="trainer core, worker core (default 0,1)")
    p.add_argument("--lora", action="store_true", help="also the LoRA sync part")
    p.add_argument("--lora-steps", type=int, default=6, help="steps per LoRA sync arm")
    p.add_argument("--no-split", action="store_true", help="only the LoRA part")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument(
        "--study",
        type=Path,
        default=None,
        help="the study JSON to add runs to (default <out>/<today>-async-split.json); its "
        "machine, steps, cores, code and arms' overrides must be this call's",
    )
    p.add_argument(
        "--any-code",
        action="store_true",
        help="add to a --study whose runs used other code (src/, the harness, this study); "
        "each run's code state is recorded and the report counts them",
    )
    p.add_argument("--run", type=Path, help=argparse.SUPPRESS)  # worker mode: a spec file
    args = p.parse_args(argv)
    unknown = [a for a in args.arms.split(",") if a not in ARMS]
    if unknown:
        p.error(f"--arms: unknown {', '.join(unknown)}; known: {', '.join(ARMS)}")
    cores = args.cores.split(",")
    if len(cores) != 2 or not all(c.isdigit() for c in cores) or cores[0] == cores[1]:
        p.error(f"--cores={args.cores}: two different core numbers, trainer first")
    args.cores = [int(c) for c in cores]
    if args.steps < 1 or args.lora_steps < 1:
        p.error("--steps and --lora-steps must be >= 1")
    return args


def src_state(repo: Path) -> str | None:
    """The code a run of this study uses (``CODE``), as ``study_file.src_state`` hashes it."""
    return study_file.src_state(repo, CODE)


def check_compatible(old: dict, new: dict, path: Path, *, any_code: bool = False) -> None:
    """``study_file.check_compatible`` with this study's settings: steps and the two cores."""
    study_file.check_compatible(old, new, path, keys=("steps", "cores"), any_code=any_code)


def run_worker(spec: dict) -> list[dict]:
    """One training in this process, pinned to ``spec['cpus']`` (when given)."""
    from benchmarks.studies.sampler_ab import run_one

    if spec.get("cpus") is not None:
        os.sched_setaffinity(0, set(spec["cpus"]))
    return run_one(spec)


def start_server(overrides: list[str], core: int, log: Path) -> tuple[subprocess.Popen, str]:
    """``rlvr rollout-server`` pinned to ``core`` (affinity set in the child before exec, vLLM's
    OpenMP threads bound to it)."""
    from rlvr.rollout.server_auth import TOKEN_ENV, new_token
    from rlvr.rollout.server_launch import free_port, wait_healthy

    # the server's shared secret, in this process's environment: the server and every
    # trainer run started after it (their environments are copies of this one) share it
    os.environ.setdefault(TOKEN_ENV, new_token())
    port = free_port("127.0.0.1")
    cmd = [sys.executable, "-m", "rlvr", "rollout-server", *overrides]
    cmd += ["--port", str(port), "--host", "127.0.0.1"]
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": str(core), "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=lambda: os.sched_setaffinity(0, {core}),
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, 900, log)
    except BaseException:
        os.killpg(proc.pid, signal.SIGTERM)
        raise
    return proc, url


def _train(work: Path, name: str, spec: dict) -> list[dict]:
    d = work / name
    d.mkdir()
    spec = {**spec, "work_dir": str(d / "run"), "records": str(d / "records.json")}
    (d / "spec.json").write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "benchmarks.studies.async_split", "--run", str(d / "spec.json")]
    env = {**os.environ}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)
    res = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    if res.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{res.stderr[-3000:]}")
    return json.loads((d / "records.json").read_text())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # a SIGTERM (timeout, kill) unwinds like Ctrl-C, so the pinned server is stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.run:  # one training, in its own process
        spec = json.loads(args.run.read_text())
        Path(spec["records"]).write_text(json.dumps(run_worker(spec)))
        return 0
    from benchmarks.harness.machine import machine_info

    seeds, arms = parse_seeds(args.seeds), args.arms.split(",")
    w = get_workload("target")
    js = args.study or args.out / f"{dt.date.today().isoformat()}-async-split.json"
    stem = js.with_suffix("")
    js.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(js.read_text()) if js.exists() else {}
    runs: dict = old.get("runs", {})
    result = {
        "machine": machine_info(), "cores": args.cores,
        "command": "python -m benchmarks.studies.async_split " + " ".join(sys.argv[1:]),
        "steps": args.steps, "target": w.target_reward, "window": w.target_window,
        "load_start": round(os.getloadavg()[0], 2), "runs": runs,
        "arms": {a: list(o) for a, o in ARMS.items()}, "src": src_state(REPO),
        "run_src": old.get("run_src", {}),  # arm -> seed -> the code state its run used
        "sync_bytes": sync_bytes_table(), "lora": old.get("lora"),
    }  # fmt: skip
    # before the model is fetched: a file whose runs do not pool stops the call at once
    check_compatible(old, result, js, any_code=args.any_code)
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("vLLM is not installed here: run with .venv-vllm/bin/python", file=sys.stderr)
        return 2
    from benchmarks.harness.worker_rlvr import config_overrides
    from benchmarks.step import prepare_model

    work = Path(tempfile.mkdtemp(prefix="async-split-"))
    model_dir = prepare_model(w.model, work)

    def save() -> None:
        result["load_now"] = round(os.getloadavg()[0], 2)
        if runs:
            result["summary"] = summarize(runs, w.target_reward, w.target_window, w.sequences)
        js.write_text(json.dumps(result, indent=1))
        write_report(stem.with_suffix(".md"), result)
        if runs:
            lag = ("token_lag_mean", "mean version lag per token", "token lag")
            plot(stem.with_suffix(".png"), runs, w.target_window, arms=list(ARMS), right=lag)

    base = {**w.worker_spec(model_dir, seed=0, threads=1, steps=args.steps), "engine": "vllm"}
    base |= {"metrics": list(METRICS), "stop_at_target": False, "target": w.target_reward,
             "window": w.target_window}  # fmt: skip
    todo = [(s, a) for s in seeds for a in arms if str(s) not in runs.get(a, {})]
    if todo and not args.no_split:
        server_cfg = [*config_overrides(base), *SERVER]
        proc, url = start_server(server_cfg, args.cores[1], work / "server.log")
        try:
            for seed, arm in todo:  # seed-major: a study cut short has whole seeds
                spec = {**base, "seed": seed, "cpus": [args.cores[0]]}
                spec["overrides"] = [*SERVER, f"rollout.server_url={url}", *ARMS[arm]]
                records = _train(work, f"{arm}-{seed}", spec)
                runs.setdefault(arm, {})[str(seed)] = records
                result["run_src"].setdefault(arm, {})[str(seed)] = result["src"]
                r = run_summary(records, w.target_reward, w.target_window, w.sequences)
                print(
                    f"{arm:>10} seed {seed}: target at step {r['steps_to_target']}, final "
                    f"reward {r['final_reward']:.3f}, step {_fmt(r['step_time_median_s'], '.1f')} s, "
                    f"token lag {_fmt(r['token_lag_mean'], '.2f')}",
                    flush=True,
                )
                save()
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(120)
    if args.lora:
        lora_runs = {}
        for arm, extra in LORA_ARMS.items():
            spec = {**base, "seed": 0, "steps": args.lora_steps, "threads": 2}
            spec["overrides"] = [
                "model.lora.enabled=true", f"model.lora.rank={LORA_RANK}",
                f"model.lora.alpha={2 * LORA_RANK}", "model.lora.target_modules=all-linear",
                "train.lr=2e-4", *extra,
            ]  # fmt: skip
            lora_runs[arm] = _train(work, f"lora-{arm}", spec)
            result["lora"] = {"runs": lora_runs, "summary": lora_summary(lora_runs)}
            save()
    save()
    shutil.rmtree(work, ignore_errors=True)  # the run folders; every record is in the JSON
    print(stem.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
