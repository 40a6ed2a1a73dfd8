"""The hf engine's greedy replies and their log-probs do not depend on the batch they run in.

Prompts of different lengths (so batch 8 left-pads all but the longest) go through the engine one
at a time and eight at a time, on a tiny model trained to say "xyz" then EOS, so replies end by
EOS, by a stop string and by the token limit. Float32 throughout: the engine's numerics only.
"""

from __future__ import annotations

import copy

import pytest
import torch
from vllm_support import base_model, trained_copy

from rlvr.rollout.base import SamplingParams
from rlvr.rollout.hf import HFEngine
from rlvr.training.tiny import build_char_tokenizer

# Batch 8 pads and multiplies other shapes than batch 1: the sums run in another order, so
# log-probs may move by float32 rounding (measured: below 1e-5), far below any real difference.
LOGPROB_TOL = 1e-4
PROMPTS = ["x", "xyz", "a b c d", "xyzxyzxy", "q", "hello world", "xy", "zzzzzzzzzzzz"]


@pytest.fixture(scope="module")
def model_tok():
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    return trained_copy(base_model(tok), tok, steps=30), tok


def _run(model, tok, ids, params, batch_size):
    engine = HFEngine(model, tok, batch_size=batch_size)
    out = []
    for start in range(0, len(ids), batch_size):
        out.extend(engine.generate(ids[start : start + batch_size], params))
    return [g[0] for g in out]


@pytest.mark.parametrize("pad_is_eos", [False, True], ids=["pad", "pad_is_eos"])
@pytest.mark.parametrize("stop", [(), ("y",)], ids=["eos", "stop_string"])
def test_greedy_replies_and_logprobs_match_in_batch_1_and_8(model_tok, stop, pad_is_eos) -> None:
    """pad_is_eos: tokenizers without a pad token pad with EOS (SmolLM2 does), so the padding
    after a stop string must not be read as the model's own EOS."""
    model, tok = model_tok
    if pad_is_eos:
        tok = copy.deepcopy(tok)
        tok.pad_token = tok.eos_token
    ids = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS]
    assert len({len(i) for i in ids}) > 4  # mixed lengths: batch 8 left-pads
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=12, stop=stop)
    one = _run(model, tok, ids, params, 1)
    eight = _run(model, tok, ids, params, 8)
    for a, b in zip(one, eight, strict=True):
        assert a.token_ids == b.token_ids
        assert a.text == b.text
        assert a.finish_reason == b.finish_reason
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < LOGPROB_TOL
    # the endings this test is about all occur
    reasons = {c.finish_reason for c in one}
    if stop:
        assert any(c.text.endswith("y") and c.token_ids[-1] != tok.eos_token_id for c in one)
    else:
        assert any(c.token_ids and c.token_ids[-1] == tok.eos_token_id for c in one)
    assert "stop" in reasons
