"""The memory plan (training/preflight/memory_plan.py) against what one training step really
holds on the GPU (``torch.cuda.max_memory_allocated``), full fine-tuning and LoRA.

Every reply runs to ``rollout.max_new_tokens`` (the tokenizer's EOS lies beyond the model's
rows) and every prompt has exactly ``data.max_prompt_tokens`` tokens, so the plan's lengths are
the step's. The error is printed (`pytest -s`) and must stay within 15% of the measurement.
"""

from __future__ import annotations

import json

import pytest
import torch
from tests.gpu.support import DEVICE, cuda_config

from rlvr.model.loading import read_model_config
from rlvr.training.preflight.memory_plan import build_plan, spec_for
from rlvr.training.tiny import build_fixed_length_tokenizer, build_tiny_model
from rlvr.training.trainer import Trainer

pytestmark = pytest.mark.gpu

VOCAB, PROMPT, REPLY = 32000, 32, 64
TOLERANCE = 0.15


@pytest.fixture(scope="module")
def plan_model(tmp_path_factory):
    """A 28M-parameter Llama-shaped model over 32000 ids, and 16 prompts of exactly 32 tokens."""
    out = tmp_path_factory.mktemp("plan")
    tok = build_fixed_length_tokenizer(VOCAB)
    model = build_tiny_model(
        tok, hidden=512, layers=4, heads=8, kv_heads=2, intermediate=1536, vocab_size=VOCAB
    )
    model.save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    rows = [{"prompt": f"{i:02d}" + "x" * (PROMPT - 2), "answer": "1"} for i in range(16)]
    (out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert all(len(tok(r["prompt"]).input_ids) == PROMPT for r in rows)
    return out


@pytest.mark.parametrize("lora", [False, True])
def test_the_plan_is_within_15_percent_of_the_measured_peak(plan_model, tmp_path, lora):
    extra = ["model.lora.enabled=true", "model.lora.rank=16"] if lora else []
    cfg = cuda_config(
        plan_model / "model",
        tmp_path,
        f"data.train_path={plan_model / 'rows.jsonl'}",
        f"data.max_prompt_tokens={PROMPT}",
        f"rollout.max_new_tokens={REPLY}",
        "algo.group_size=4",
        "algo.prompts_per_step=4",
        "algo.micro_batch_size=8",
        "rollout.engine=hf",
        *extra,
    )
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    trainer = Trainer(cfg)
    try:
        metrics = trainer.train_step()
        measured = torch.cuda.max_memory_allocated() - base
    finally:
        trainer.run.close()
    assert metrics["response_len_mean"] == REPLY  # the plan's lengths are the step's
    total = torch.cuda.get_device_properties(0).total_memory
    spec = spec_for(
        cfg,
        read_model_config(cfg.model.name_or_path),
        world_size=1,
        device=DEVICE,
        device_total=total,
    )
    plan = build_plan(spec)
    error = (plan.peak - measured) / measured
    print(
        f"\nmemory plan ({'LoRA' if lora else 'full'}): planned {plan.peak / 2**20:.1f} MiB, "
        f"measured {measured / 2**20:.1f} MiB, error {error:+.1%}"
    )
    assert abs(error) <= TOLERANCE, (plan.peak, measured, plan.resident, plan.update, plan.rollout)
