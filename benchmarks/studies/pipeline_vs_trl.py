"""Is rlvr's training loop TRL's, join by join? Two checks on the ``target`` workload.

    python -m benchmarks.studies.pipeline_vs_trl --part update --seeds 0,1,2 --steps 3 --precision float32
    python -m benchmarks.studies.pipeline_vs_trl --part sample --seeds 0,1,2 --steps 8

``update``: rlvr trains ``--steps`` real steps (``Trainer.train_step``: sampling, reward,
advantages, loss, micro-batches, clipping, AdamW, schedule) and records each batch; TRL's
``GRPOTrainer.train()`` then runs the same number of steps, its ``rollout_func`` hook serving it
rlvr's replies (``benchmarks/studies/pipeline_trl_side.py``). From there on everything is TRL's own. The
two runs' rewards and gradient norms are compared step by step and their final weights as update
vectors (final minus initial). ``benchmarks.studies.grad_vs_trl`` compares one loss gradient; this
compares everything that joins batches to weights. In float32 the two must agree up to summation
order; under bf16 both round, differently.

``sample``: both sides run ``--steps`` steps at learning rate ~0 (rlvr refuses 0: 1e-30, below
every weight's float32 spacing; TRL 0), so every batch is drawn from the initial model by that
side's own generation path; the same prompts on both sides. Compared: reply length (mean and its
standard error), reward, the share of replies ending in EOS.

Writes ``<out>/<date>-pipeline-vs-trl-<part>-<precision>.{json,md}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from benchmarks.harness.machine import machine_info
from benchmarks.harness.runner import REPO, worker_env
from benchmarks.harness.workloads import step_schedule
from benchmarks.studies.grad_vs_trl import compare_grads
from benchmarks.studies.vs_trl import (
    add_common_args,
    resolve,
    target_model,
    trl_version,
    write_results,
)

PARTS = ("update", "sample")
# rlvr's config wants lr > 0; this one moves no float32 weight (AdamW's first step is ~lr)
NEAR_ZERO_LR = 1e-30


def update_vectors(init: dict, a: dict, b: dict) -> tuple[dict, dict]:
    """``a - init`` and ``b - init`` over the tensors all three hold (float32)."""
    keys = [k for k in init if k in a and k in b]
    da = {k: a[k].float() - init[k].float() for k in keys}
    db = {k: b[k].float() - init[k].float() for k in keys}
    return da, db


def sample_stats(records: list[dict], answers: dict[tuple, str], score, eos_id: int) -> dict:
    """Reply length (mean, standard error), mean reward and EOS-ended share over every sequence
    of ``records`` (per step ``prompt_ids``/``completion_ids``); ``answers``: prompt ids -> the
    reference answer; ``score(reply ids, answer) -> float``."""
    lens, rewards, eos = [], [], []
    for rec in records:
        for p, c in zip(rec["prompt_ids"], rec["completion_ids"], strict=True):
            lens.append(len(c))
            rewards.append(score(c, answers[tuple(p)]))
            eos.append(float(bool(c) and c[-1] == eos_id))
    n = len(lens)
    return {
        "sequences": n,
        "len_mean": statistics.fmean(lens),
        "len_se": statistics.stdev(lens) / math.sqrt(n) if n > 1 else float("nan"),
        "reward_mean": statistics.fmean(rewards),
        "eos_share": statistics.fmean(eos),
    }


def difference(a: dict, b: dict) -> dict:
    """``a``'s mean length minus ``b``'s, its standard error and z (independent samples)."""
    d = a["len_mean"] - b["len_mean"]
    se = math.hypot(a["len_se"], b["len_se"])
    return {"len_diff": d, "len_diff_se": se, "z": d / se if se > 0 else float("nan")}


@contextlib.contextmanager
def rlvr_trainer(spec: dict, run_dir: Path, lr: float | None = None) -> Iterator:
    """rlvr's ``Trainer`` with the workload's settings (``lr`` overrides the spec's); its engine
    and reward workers are closed on the way out."""
    from benchmarks.harness.worker_rlvr import config_overrides
    from rlvr.config import load_config
    from rlvr.training.trainer import Trainer

    torch.set_num_threads(spec["threads"])
    over = config_overrides({**spec, "lr": spec["lr"] if lr is None else lr})
    trainer = Trainer(load_config(None, [*over, "train.save_every=0"]), run_dir=run_dir)
    try:
        yield trainer
    finally:
        trainer.run.close()


def _ids(batch) -> dict:
    return {
        "prompt_ids": [list(map(int, p)) for p in batch.seq_prompt_ids],
        "completion_ids": [list(map(int, c)) for c in batch.comp_ids],
    }


def rlvr_update(spec: dict, work: Path) -> tuple[dict, list[dict], list[dict], dict]:
    """rlvr's initial weights, recorded batches, per-step metrics and final weights."""
    with rlvr_trainer(spec, work / "rlvr-run") as trainer:
        model = trainer.state.model
        init = {k: v.detach().clone() for k, v in model.state_dict().items()}
        batches, steps = [], []
        for _ in range(spec["steps"]):
            m = trainer.train_step()
            batches.append(_ids(trainer.last_batch))
            steps.append({"reward": m["reward_mean"], "grad_norm": m["grad_norm"], "lr": m["lr"]})
        final = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return init, batches, steps, final


def rlvr_sample(spec: dict, work: Path) -> list[dict]:
    records = []
    with rlvr_trainer(spec, work / "rlvr-run", lr=NEAR_ZERO_LR) as trainer:
        for _ in range(spec["steps"]):
            trainer.train_step()
            records.append(_ids(trainer.last_batch))
    return records


def run_trl(trl_python: Path, seed_dir: Path, part: str, threads: int) -> None:
    subprocess.run(
        [str(trl_python), "-m", "benchmarks.studies.pipeline_trl_side", str(seed_dir), part],
        env=worker_env(threads, [REPO, REPO / "src"]),
        check=True,
    )


def one_seed(part: str, spec: dict, seed_dir: Path, trl_python: Path, tokenizer) -> dict:
    (seed_dir / "spec.json").write_text(json.dumps(spec))
    if part == "update":
        init, batches, ours, final = rlvr_update(spec, seed_dir)
        (seed_dir / "batches.json").write_text(json.dumps(batches))
        run_trl(trl_python, seed_dir, part, spec["threads"])
        theirs = json.loads((seed_dir / "trl_steps.json").read_text())
        da, db = update_vectors(init, final, torch.load(seed_dir / "trl_weights.pt"))
        return {
            "steps": [
                {"rlvr": o, "trl": t, "grad_norm_ratio": o["grad_norm"] / t["grad_norm"]}
                for o, t in zip(ours, theirs, strict=True)
            ],
            "update": compare_grads(da, db),
        }
    from rlvr.rewards.math import grade

    ours = rlvr_sample(spec, seed_dir)
    run_trl(trl_python, seed_dir, part, spec["threads"])
    theirs = json.loads((seed_dir / "trl_samples.json").read_text())
    answers = {
        tuple(tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]): r["answer"]
        for step in spec["schedule"]
        for r in step
    }

    def score(ids, answer):
        return grade(tokenizer.decode(ids, skip_special_tokens=True), answer).score

    eos = tokenizer.eos_token_id
    a = sample_stats(ours, answers, score, eos)
    b = sample_stats(theirs, answers, score, eos)
    return {"rlvr": a, "trl": b, "diff": difference(a, b)}


def render(payload: dict) -> str:
    m = payload["machine"]
    part = payload["part"]
    lines = [
        f"# rlvr's training loop against TRL's: {part} ({payload['date']})",
        "",
        f"- Machine: {m['cpu']}, {m['cores']} cores; precision {payload['precision']}; "
        f"TRL {payload['trl_version']}",
        f"- Workload `target` (4 prompts x 8 samples, at most 48 tokens, micro-batches of 8), "
        f"{payload['steps']} steps per seed",
        f"- Command: `{payload['command']}`",
        "",
    ]
    if part == "update":
        lines += [
            "| seed | rewards equal at every step | gradient norm rlvr/TRL per step | "
            "update vector: norm rlvr/TRL | unit-vector difference | worst tensor (relative) |",
            "|---|---|---|---|---|---|",
        ]
        for r in payload["runs"]:
            u = r["update"]
            same = all(s["rlvr"]["reward"] == s["trl"]["reward"] for s in r["steps"])
            ratios = ", ".join(f"{s['grad_norm_ratio']:.6f}" for s in r["steps"])
            lines.append(
                f"| {r['seed']} | {'yes' if same else 'no'} | {ratios} | {u['norm_ratio']:.6f} | "
                f"{u['unit_diff']:.2e} | {u['worst_tensor']} ({u['worst_rel_diff']:.2e}) |"
            )
        lines += [
            "",
            "TRL trains on rlvr's replies (its `rollout_func`); rewards, advantages, loss, "
            "accumulation, clipping, AdamW and schedule are each side's own. Update vector: final "
            "minus initial weights; unit-vector difference 0 for the same direction, 1.41 for "
            "orthogonal ones. AdamW's first steps are close to lr x sign(gradient), so an element "
            "whose gradient is near 0 can flip on summation order alone.",
        ]
    else:
        lines += [
            "| seed | sequences per side | reply length rlvr | reply length TRL | "
            "difference (z) | reward rlvr / TRL | ends in EOS rlvr / TRL |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in payload["runs"]:
            a, b, d = r["rlvr"], r["trl"], r["diff"]
            lines.append(
                f"| {r['seed']} | {a['sequences']} | {a['len_mean']:.2f} ± {a['len_se']:.2f} | "
                f"{b['len_mean']:.2f} ± {b['len_se']:.2f} | {d['len_diff']:+.2f} ({d['z']:+.2f}) | "
                f"{a['reward_mean']:.3f} / {b['reward_mean']:.3f} | "
                f"{a['eos_share']:.3f} / {b['eos_share']:.3f} |"
            )
        lines += [
            "",
            "Both sides at learning rate ~0: every batch comes from the initial model through the "
            "side's own generation path, on the same prompts. ± is the standard error of the mean; "
            "z = difference / its standard error (replies of one prompt are not independent, so "
            "treat |z| < 2 as no difference, not as proof of one).",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.pipeline_vs_trl",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--part", choices=PARTS, required=True)
    p.add_argument("--steps", type=int, default=None, help="steps per seed (update 3, sample 8)")
    add_common_args(p, precision="auto", seeds_help="comma list (default 0)")
    args = p.parse_args(argv)
    steps = args.steps or (3 if args.part == "update" else 8)
    if steps < 1:
        p.error(f"--steps {steps}: at least 1")
    resolved = resolve(p, args, "pipeline")
    if resolved is None:
        return 2
    seeds, precision, trl_python = resolved
    from transformers import AutoTokenizer

    w, work, model_dir = target_model("pipeline")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    runs = []
    for seed in seeds:
        spec = w.worker_spec(
            model_dir, seed=seed, threads=args.threads, steps=steps, precision=precision
        )
        spec["schedule"] = step_schedule(w, steps, tokenizer, seed)
        seed_dir = work / f"seed{seed}"
        seed_dir.mkdir()
        result = one_seed(args.part, spec, seed_dir, trl_python, tokenizer)
        runs.append({"seed": seed, **result})
        print(f"[pipeline] seed {seed}: {json.dumps(result)}", flush=True)
    payload = {
        "command": "python -m benchmarks.studies.pipeline_vs_trl " + " ".join(argv),
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine_info(),
        "part": args.part,
        "precision": precision,
        "steps": steps,
        "trl_version": trl_version(trl_python),
        "runs": runs,
    }
    stem = f"{payload['date']}-pipeline-vs-trl-{args.part}-{precision}"
    write_results(args.out / stem, payload, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
