"""Same batch, same model: is rlvr's Dr.GRPO gradient TRL's?

    python -m benchmarks.studies.grad_vs_trl --seeds 0,1 --precision float32

For each seed, rlvr samples and scores one batch of the ``target`` workload (4 prompts x 8
samples, at most 48 tokens) and computes its update's gradient (Dr.GRPO, beta 0, one update per
batch, micro-batches of 8; the optimizer step is replaced by a copy of the gradients and clipping
is off). TRL 1.16, in its own venv, then computes the gradient of its own ``dr_grpo`` loss on the
same token ids and advantages from the same initial weights (``benchmarks/studies/grad_trl_side.py``).
The two gradients are compared tensor by tensor: a difference in the maths (normalisation, masks,
the shift between logits and labels, which tokens count) shows up here, free of sampling noise.
Writes ``DATE-grad-vs-trl.{json,md}`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.harness.machine import machine_info
from benchmarks.harness.runner import REPO, worker_env
from benchmarks.studies.vs_trl import (
    add_common_args,
    resolve,
    target_model,
    trl_version,
    write_results,
)


def compare_grads(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict:
    """How far gradient ``a`` is from ``b`` (same parameter names).

    ``unit_diff``: the norm of the difference of the two unit vectors (0 for the same direction,
    sqrt(2) for orthogonal ones); ``norm_ratio``: |a| / |b|; ``worst``: the tensor whose own
    relative difference |a_t - b_t| / |b_t| is largest. Computed in float64.
    """
    if set(a) != set(b):
        raise ValueError(f"parameter names differ: {sorted(set(a) ^ set(b))[:5]}")
    names = sorted(a)
    va = torch.cat([a[n].double().flatten() for n in names])
    vb = torch.cat([b[n].double().flatten() for n in names])
    na, nb = va.norm(), vb.norm()
    if na == 0 or nb == 0:
        raise ValueError("a gradient is zero: nothing to compare (no advantage in the batch?)")
    per = {n: float((a[n].double() - b[n].double()).norm() / b[n].double().norm()) for n in names}
    worst = max(per, key=per.get)
    return {
        "tensors": len(names),
        "norm_a": float(na),
        "norm_b": float(nb),
        "norm_ratio": float(na / nb),
        "unit_diff": float((va / na - vb / nb).norm()),
        "worst_tensor": worst,
        "worst_rel_diff": per[worst],
    }


def rlvr_batch_and_grads(spec: dict, work: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """rlvr's batch (prompt ids, reply ids, advantages per sequence) and its update's gradient."""
    from benchmarks.harness.worker_rlvr import config_overrides
    from rlvr.config import load_config
    from rlvr.training.trainer import Trainer
    from rlvr.training.update import update

    torch.set_num_threads(spec["threads"])
    overrides = [*config_overrides(spec), "train.max_grad_norm=1e12"]  # compare unclipped
    trainer = Trainer(load_config(None, overrides), run_dir=work / "rlvr-run")
    step, state = trainer.step_fn, trainer.state
    grads: dict[str, torch.Tensor] = {}

    def keep_gradients(*args, **kwargs) -> None:  # stands in for the optimizer step
        for name, p in state.model.named_parameters():
            if p.grad is not None:
                grads[name] = p.grad.detach().clone()

    state.optimizer.step = keep_gradients
    try:
        batch = step.next_batch()
        step.score(batch)
        step.logprobs(batch, {})
        step.prepare(batch)
        update(batch, state, trainer.run)
    finally:
        trainer.run.close()
    dump = {
        "prompt_ids": [list(map(int, p)) for p in batch.seq_prompt_ids],
        "completion_ids": [list(map(int, c)) for c in batch.comp_ids],
        "advantages": [float(x) for x in batch.advantages.reshape(-1)],
        "rewards": [float(x) for x in batch.scores.reshape(-1)],
    }
    return dump, grads


def render(payload: dict) -> str:
    m = payload["machine"]
    lines = [
        f"# rlvr's Dr.GRPO gradient against TRL's on the same batch ({payload['date']})",
        "",
        f"- Machine: {m['cpu']}, {m['cores']} cores; precision {payload['precision']}; "
        f"TRL {payload['trl_version']}",
        "- Workload `target` (4 prompts x 8 samples, at most 48 tokens, micro-batches of 8); "
        "rlvr samples and scores the batch, both compute the gradient from the same weights",
        f"- Command: `{payload['command']}`",
        "",
        "| seed | tokens | rewards > 0 | norm rlvr / norm TRL | unit-vector difference | "
        "worst tensor (relative difference) |",
        "|---|---|---|---|---|---|",
    ]
    for r in payload["runs"]:
        c = r["compare"]
        lines.append(
            f"| {r['seed']} | {r['completion_tokens']} | {r['rewarded']}/{r['sequences']} | "
            f"{c['norm_ratio']:.6f} | {c['unit_diff']:.2e} | {c['worst_tensor']} "
            f"({c['worst_rel_diff']:.2e}) |"
        )
    lines += [
        "",
        "Unit-vector difference: the norm of a / norm(a) - b / norm(b), 0 for the same direction, 1.41 for orthogonal "
        "gradients. "
        + (
            "In float32 the differences come from summation order alone."
            if payload["precision"] == "float32"
            else "Under bf16 autocast both sides round differently (rlvr's grouped eager "
            "attention against TRL's default attention), so expect more."
        ),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.grad_vs_trl", description=__doc__
    )
    add_common_args(p, precision="float32", seeds_help="comma list: one batch per seed (default 0)")
    args = p.parse_args(argv)
    resolved = resolve(p, args, "grad")
    if resolved is None:
        return 2
    seeds, precision, trl_python = resolved
    w, work, model_dir = target_model("grad")
    runs = []
    for seed in seeds:
        spec = w.worker_spec(
            model_dir, seed=seed, threads=args.threads, steps=1, precision=precision
        )
        seed_dir = work / f"seed{seed}"
        seed_dir.mkdir()
        dump, ours = rlvr_batch_and_grads(spec, seed_dir)
        (seed_dir / "batch.json").write_text(
            json.dumps({**dump, "model_dir": str(model_dir), "spec": spec})
        )
        subprocess.run(
            [str(trl_python), "-m", "benchmarks.studies.grad_trl_side", str(seed_dir)],
            env=worker_env(args.threads, [REPO, REPO / "src"]),
            check=True,
        )
        theirs = torch.load(seed_dir / "trl_grads.pt")
        compare = compare_grads(ours, theirs)
        runs.append(
            {
                "seed": seed,
                "sequences": len(dump["completion_ids"]),
                "completion_tokens": sum(len(c) for c in dump["completion_ids"]),
                "rewarded": sum(r > 0 for r in dump["rewards"]),
                "compare": compare,
            }
        )
        print(f"[grad] seed {seed}: {json.dumps(compare)}", flush=True)
    payload = {
        "command": "python -m benchmarks.studies.grad_vs_trl " + " ".join(argv),
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine_info(),
        "precision": precision,
        "trl_version": trl_version(trl_python),
        "runs": runs,
    }
    write_results(args.out / f"{payload['date']}-grad-vs-trl-{precision}", payload, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
