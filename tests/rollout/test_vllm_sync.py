"""After training steps and a weight sync, vLLM samples exactly the trainer's policy.

Each test first loads a known starting point into the shared engine, shows the engine is stale
against the trained model (so the comparison can fail), syncs, and compares greedy tokens (against
transformers ``generate`` through ``HFEngine``) and per-token log-probs (against the trainer's
``sequence_logprobs``) within ``LOGPROB_TOL``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from vllm_support import (
    LOGPROB_TOL,
    STALE_MIN,
    base_model,
    max_abs_diff,
    trained_copy,
    trainer_logprobs,
)

from rlvr.rollout.base import SamplingParams
from rlvr.rollout.hf import HFEngine

pytestmark = pytest.mark.vllm

PROMPTS = ["x", "xy", "hello", "2+3=", "xyz"]
GREEDY = SamplingParams(n=1, temperature=0.0, max_new_tokens=12)


def _prompt_ids(tok) -> list[list[int]]:
    return [tok(p, add_special_tokens=False).input_ids for p in PROMPTS]


def _engine_vs_trainer(engine, model, tok) -> tuple[list, list, float]:
    """Greedy completions of both engines and the max |trainer - engine| log-prob."""
    prompts = _prompt_ids(tok)
    ours = [g[0] for g in engine.generate(prompts, GREEDY)]
    ref = [g[0] for g in HFEngine(model, tok).generate(prompts, GREEDY)]
    lp = trainer_logprobs(model, prompts, [c.token_ids for c in ours], tok.pad_token_id)
    return ours, ref, max_abs_diff(lp, [c.logprobs for c in ours])


def _assert_same_greedy(ours, ref) -> None:
    for a, b in zip(ours, ref, strict=True):
        assert a.token_ids == b.token_ids
        assert a.text == b.text
        assert a.finish_reason == b.finish_reason


def test_full_weight_sync_matches_trained_model(engine, tok):
    start = base_model(tok)
    trained = trained_copy(start, tok)
    engine.load_weights(start.state_dict().items())
    _, _, stale = _engine_vs_trainer(engine, trained, tok)
    assert stale > STALE_MIN  # the engine still samples the untrained weights

    engine.load_weights(trained.state_dict().items())
    ours, ref, diff = _engine_vs_trainer(engine, trained, tok)
    _assert_same_greedy(ours, ref)
    assert diff < LOGPROB_TOL
    # The trained model stops by itself: "xy" -> "z" then EOS, the EOS kept in token_ids.
    xy = ours[PROMPTS.index("xy")]
    assert xy.token_ids == tok("z", add_special_tokens=False).input_ids + [tok.eos_token_id]
    assert (xy.text, xy.finish_reason) == ("z", "stop")

    # Every tensor went, in the engine's dtype: 2 blocks of 9 tensors + embedding + final norm
    # = 20 tensors (the tied lm_head is the embedding); float32 bytes = 4 x parameter count.
    stats = engine.last_sync_stats
    n_params = sum(p.numel() for p in trained.parameters())
    assert (stats.tensors, stats.bytes, stats.lora_merged) == (20, 4 * n_params, 0)


def test_bucketed_sync_equals_single_bucket(engine, tok):
    """One block per bucket (bucket_bytes=1) loads the same weights as one bucket for all."""
    trained = trained_copy(base_model(tok), tok, steps=4)
    engine.load_weights(base_model(tok).state_dict().items())
    old = engine.bucket_bytes
    try:
        engine.bucket_bytes = 1
        engine.load_weights(trained.state_dict().items())
    finally:
        engine.bucket_bytes = old
    # embedding | layer 0 | layer 1 | final norm: a bucket closes at the first unit boundary
    assert engine.last_sync_stats.buckets == 4
    ours, ref, diff = _engine_vs_trainer(engine, trained, tok)
    _assert_same_greedy(ours, ref)
    assert diff < LOGPROB_TOL


def test_lora_sync_merges_adapter(engine, holder, tok):
    peft = trained_copy(holder.model, tok)  # adapter-only training: base weights frozen
    base_before = {n: t.clone() for n, t in peft.state_dict().items() if "base_layer" in n}
    engine.load_weights(holder.model.state_dict().items())  # fresh adapter = the base model
    _, _, stale = _engine_vs_trainer(engine, peft, tok)
    assert stale > STALE_MIN

    engine.load_weights(peft.state_dict().items())
    ours, ref, diff = _engine_vs_trainer(engine, peft, tok)
    _assert_same_greedy(ours, ref)
    assert diff < LOGPROB_TOL
    # 7 adapted projections in each of 2 blocks were merged; the trainer's weights are untouched
    assert engine.last_sync_stats.lora_merged == 14
    for n, t in peft.state_dict().items():
        if n in base_before:
            assert torch.equal(t, base_before[n])


def test_lora_sync_with_random_adapter(engine, holder, tok):
    """Large random adapters (not just trained ones) merge exactly: W + (alpha / r) B A."""
    peft = copy.deepcopy(holder.model)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    engine.load_weights(peft.state_dict().items())
    ours, ref, diff = _engine_vs_trainer(engine, peft, tok)
    _assert_same_greedy(ours, ref)
    assert diff < LOGPROB_TOL


def test_unknown_tensor_name_fails_before_sending(engine, tok):
    weights = dict(base_model(tok).state_dict())
    weights["model.extra_head.weight"] = torch.zeros(2, 2)
    with pytest.raises(ValueError, match=r"unknown tensor names \['model.extra_head.weight'\]"):
        engine.load_weights(weights.items())


def test_missing_tensor_fails(engine, tok):
    weights = dict(base_model(tok).state_dict())
    del weights["model.norm.weight"]
    with pytest.raises(ValueError, match="model.norm.weight"):
        engine.load_weights(weights.items())
    engine.load_weights(base_model(tok).state_dict().items())  # leave a consistent engine
