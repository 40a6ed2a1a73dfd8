"""TRL's side of ``benchmarks.studies.grad_vs_trl``: TRL's own Dr.GRPO loss on a batch rlvr sampled.

    python -m benchmarks.studies.grad_trl_side DIR     # TRL's venv; reads DIR/batch.json

Builds a ``GRPOTrainer`` with the benchmark's settings (``worker_trl.grpo_args``), lays the batch
out as TRL's ``_generate_and_score_completions`` does (prompts left-padded, completions
right-padded, a mask over each reply's tokens), calls TRL's ``_compute_loss`` on each micro-batch
in order, backpropagates, and saves the summed gradient to ``DIR/trl_grads.pt``. Nothing of TRL
is patched; only the micro-batch layout is ours, and ``trl_micro_batch`` is tested in rlvr's venv.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def trl_micro_batch(
    prompts: list[list[int]],
    completions: list[list[int]],
    advantages: list[float],
    pad_id: int,
) -> dict[str, torch.Tensor]:
    """One micro-batch in TRL's layout: ``prompt_ids``/``prompt_mask`` left-padded,
    ``completion_ids``/``completion_mask`` right-padded, ``advantages`` one per sequence."""
    lp = max(len(p) for p in prompts)
    lc = max(1, max(len(c) for c in completions))
    b = len(prompts)
    pid = torch.full((b, lp), pad_id, dtype=torch.long)
    pm = torch.zeros((b, lp), dtype=torch.long)
    cid = torch.full((b, lc), pad_id, dtype=torch.long)
    cm = torch.zeros((b, lc), dtype=torch.long)
    for r, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        pid[r, lp - len(p) :] = torch.tensor(p, dtype=torch.long)
        pm[r, lp - len(p) :] = 1
        if c:
            cid[r, : len(c)] = torch.tensor(c, dtype=torch.long)
            cm[r, : len(c)] = 1
    return {
        "prompt_ids": pid,
        "prompt_mask": pm,
        "completion_ids": cid,
        "completion_mask": cm,
        "advantages": torch.tensor(advantages, dtype=torch.float32),
    }


def main(argv: list[str]) -> int:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from benchmarks.harness.worker_trl import arithmetic_reward, grpo_args

    out = Path(argv[0])
    d = json.loads((out / "batch.json").read_text())
    spec = d["spec"]
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    tok = AutoTokenizer.from_pretrained(d["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(d["model_dir"], dtype=torch.float32)
    n = len(d["completion_ids"])
    rows = [{"prompt": "unused", "answer": "0"}] * n  # the batch is given, not generated
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[arithmetic_reward],
        args=grpo_args({**spec, "work_dir": str(out / "trl-run")}),
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
    )
    m = trainer.model
    m.train()
    mb = spec["micro_batch"]
    # what Trainer.train sets before the first step: the loss divides by the accumulation steps
    trainer.current_gradient_accumulation_steps = n // mb
    dtype = torch.bfloat16 if spec["precision"] == "bf16" else None
    for start in range(0, n, mb):
        idx = range(start, start + mb)
        inputs = trl_micro_batch(
            [d["prompt_ids"][i] for i in idx],
            [d["completion_ids"][i] for i in idx],
            [d["advantages"][i] for i in idx],
            tok.pad_token_id,
        )
        # TRL under bf16=True runs its forward in accelerate's bf16 autocast
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = trainer._compute_loss(m, inputs)
        loss.backward()
    grads = {k: p.grad.detach().clone() for k, p in m.named_parameters() if p.grad is not None}
    torch.save(grads, out / "trl_grads.pt")
    print(f"[grad] TRL {trainer.loss_type}: gradient of {len(grads)} tensors saved", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
