"""The float32 output layer in vocabulary slices while the hf engine decodes
(rollout/sliced_head.py): the same logits as the whole layer, only where it was measured to pay,
swapped in for the decoding loop alone, and the replies and log-probs of a run unchanged."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn
from vllm_support import base_model, max_abs_diff, peft_model, trained_copy, trainer_logprobs

from rlvr.rollout import hf
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.hf import HFEngine
from rlvr.rollout.sliced_head import SlicedHead, sliced_head, slicing_pays
from rlvr.training import lean_backward
from rlvr.training.tiny import build_char_tokenizer

PROMPTS = ["x", "xyz", "a b c d", "xyzxyzxy", "q", "hello world"]


@pytest.mark.parametrize("bias", [False, True])
def test_sliced_logits_are_the_whole_layers(bias):
    """100 output features in slices of 16 (the last one 4 wide), a [B, T, H] input: every
    column is the whole layer's, bias included."""
    torch.manual_seed(0)
    head = nn.Linear(24, 100, bias=bias)
    x = torch.randn(3, 2, 24)
    with torch.no_grad():
        got, want = SlicedHead(head, rows=16)(x), head(x)
    assert got.shape == (3, 2, 100)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    # each slice is its own columns: zeroing one slice's weight rows zeroes only those logits
    with torch.no_grad():
        head.weight[32:48] = 0.0
        got = SlicedHead(head, rows=16)(x)
    expect = head.bias[32:48].expand(3, 2, 16) if bias else torch.zeros(3, 2, 16)
    torch.testing.assert_close(got[..., 32:48], expect)
    torch.testing.assert_close(got[..., 16:32], want[..., 16:32], atol=1e-6, rtol=1e-6)


def test_slicing_pays_only_for_a_wide_float32_head_outside_autocast():
    wide = nn.Linear(8, 64)
    assert slicing_pays(wide, rows=16)
    assert not slicing_pays(wide, rows=33)  # fewer than two slices
    assert not slicing_pays(nn.Linear(8, 64).to(torch.bfloat16), rows=16)
    assert not slicing_pays(nn.Embedding(64, 8), rows=16)
    assert not slicing_pays(None, rows=16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not slicing_pays(wide, rows=16)  # oneDNN's bf16 head gains nothing from slices


@pytest.fixture(scope="module")
def model_tok():
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    return trained_copy(base_model(tok), tok, steps=30), tok


def test_sliced_head_is_swapped_in_for_the_block_only(model_tok):
    """Inside the block the model's head is a SlicedHead over the same weight and the forward's
    logits are the whole head's; afterwards (also after an error) the original module is back."""
    model, tok = model_tok
    head = model.get_output_embeddings()
    rows = max(1, head.out_features // 4)
    ids = torch.tensor([tok("xyz hello", add_special_tokens=False).input_ids])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        with sliced_head(model, rows=rows) as on:
            assert on
            inside = model.get_output_embeddings()
            assert isinstance(inside, SlicedHead) and inside.weight is head.weight
            assert inside.bias is head.bias and not list(inside.parameters(recurse=False))
            got = model(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert model.get_output_embeddings() is head
    with pytest.raises(RuntimeError, match="mid-decode"), sliced_head(model, rows=rows):
        raise RuntimeError("mid-decode")
    assert model.get_output_embeddings() is head
    with sliced_head(model) as on:  # 2048-row slices: this vocabulary is one slice, left whole
        assert not on and model.get_output_embeddings() is head


def _engine_run(model, tok, monkeypatch, rows: int | None, **engine_kw):
    """Sampled replies of the hf engine and how many passes went through a SlicedHead, with
    slices of ``rows`` (None: the engine's own setting)."""
    if rows is not None:
        monkeypatch.setattr(hf, "sliced_head", functools.partial(sliced_head, rows=rows))
    calls = []
    orig = SlicedHead.forward
    monkeypatch.setattr(SlicedHead, "forward", lambda self, x: calls.append(1) or orig(self, x))
    ids = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS]
    params = SamplingParams(n=3, temperature=0.8, max_new_tokens=10, seed=5)
    groups = HFEngine(model, tok, **engine_kw).generate(ids, params)
    monkeypatch.undo()
    return [c for g in groups for c in g], len(calls), ids


def test_engine_decodes_through_the_sliced_head_with_the_same_replies(model_tok, monkeypatch):
    """The join: the hf engine's float32 decoding runs every pass through the sliced head (one
    per pass: the prefill and each step), samples the replies the whole head gives, records the
    log-probs the trainer recomputes, and leaves the model's own head in place; under bf16
    autocast the head stays whole."""
    model, tok = model_tok
    head = model.get_output_embeddings()
    rows = max(1, head.out_features // 4)
    whole, whole_calls, ids = _engine_run(model, tok, monkeypatch, None)
    sliced, sliced_calls, _ = _engine_run(model, tok, monkeypatch, rows)
    assert whole_calls == 0  # this vocabulary is below two 2048-row slices
    # the prefill, then one pass per token fed back (the last token sampled is not fed)
    assert sliced_calls == max(len(c.token_ids) for c in sliced)
    assert [c.token_ids for c in sliced] == [c.token_ids for c in whole]
    assert (
        max_abs_diff([torch.tensor(c.logprobs) for c in whole], [c.logprobs for c in sliced]) < 1e-5
    )
    prompts = [ids[c.prompt_index] for c in sliced]
    trainer = trainer_logprobs(model, prompts, [c.token_ids for c in sliced], tok.pad_token_id, 0.8)
    assert max_abs_diff(trainer, [c.logprobs for c in sliced]) < 1e-4
    assert model.get_output_embeddings() is head
    _, bf16_calls, _ = _engine_run(model, tok, monkeypatch, rows, autocast=True)
    assert bf16_calls == 0
    _, generate_calls, _ = _engine_run(model, tok, monkeypatch, rows, decoder="generate")
    assert generate_calls == 0  # transformers' generate keeps the model's own head


def test_the_trainers_lean_head_is_sliced(model_tok):
    """The trainer installs lean layers before building the engine: its head is a LeanLinear,
    still an nn.Linear over a float32 weight, so it is sliced too."""
    import copy

    model, _ = model_tok
    lean = copy.deepcopy(model)
    lean_backward.install(lean)
    head = lean.get_output_embeddings()
    assert type(head) is lean_backward.LeanLinear
    assert slicing_pays(head, rows=max(1, head.out_features // 4))


def test_a_lora_models_head_is_sliced_through_peft(model_tok):
    """Under a peft adapter the setter reaches the wrapped model's head: sliced inside the block,
    the same logits, the original head back afterwards."""
    _, tok = model_tok
    model = peft_model(tok)
    head = model.get_output_embeddings()
    ids = torch.tensor([tok("a b c", add_special_tokens=False).input_ids])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        with sliced_head(model, rows=max(1, head.out_features // 3)) as on:
            assert on and isinstance(model.base_model.model.lm_head, SlicedHead)
            got = model(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert model.base_model.model.lm_head is head
