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


# ----------------------------------------------------------------------------- image prompts

IMAGE_QUESTIONS = ["How many?", "Count.", "How many red squares?", "Count them."]


def _image_rows(colours: list[str], widths: list[int], questions: list[str]) -> list[dict]:
    from PIL import Image

    return [
        {"prompt": q, "images": [Image.new("RGB", (w, 56), c)]}
        for c, w, q in zip(colours, widths, questions, strict=True)
    ]


@pytest.fixture(scope="module")
def vlm_replies_by_colour(tiny_vlm_dir):
    """The tiny VLM after a few steps of next-token loss through the trainer's own log-prob
    path: a red image -> "xyz" then EOS, a blue one -> a reply longer than the token limit. So
    which reply (and which ending) a prompt gets depends on its image."""
    from rlvr.data.multimodal import collate_vision, render_multimodal_rows
    from rlvr.model.forward import build_sequence_batch, sequence_logprobs
    from rlvr.model.vlm import load_policy_model

    model, tok, processor = load_policy_model(str(tiny_vlm_dir))
    rows = _image_rows(["red", "blue", "red", "blue"], [28, 56, 84, 42], IMAGE_QUESTIONS)
    eos = [tok.eos_token_id]
    replies = [
        tok(r, add_special_tokens=False).input_ids + (eos if r == "xyz" else [])
        for r in ["xyz", "abcdefghijklmnop", "xyz", "abcdefghijklmnop"]
    ]
    _, ids, vision = render_multimodal_rows(rows, processor)
    sb = build_sequence_batch(
        ids,
        replies,
        tok.pad_token_id,
        vision=collate_vision(vision),
        image_token_id=processor.image_token_id,
    )
    torch.manual_seed(1)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-2)
    for _ in range(12):
        logp, _ = sequence_logprobs(model, sb)
        (-(logp * sb.completion_mask).sum() / sb.completion_mask.sum()).backward()
        opt.step()
        opt.zero_grad()
    return model.eval(), tok, processor


def test_greedy_image_replies_match_in_batch_1_and_4(vlm_replies_by_colour) -> None:
    """Eight image prompts of different widths (so different numbers of image tokens and left
    padding in a batch of 4) through the hf engine one at a time and four at a time."""
    from rlvr.data.multimodal import render_multimodal_rows

    model, tok, processor = vlm_replies_by_colour
    colours = ["red", "blue"] * 4
    rows = _image_rows(colours, [28 + 14 * i for i in range(8)], IMAGE_QUESTIONS * 2)
    _, ids, vision = render_multimodal_rows(rows, processor)
    assert len({len(i) for i in ids}) > 4
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=10)

    def run(batch_size: int) -> list:
        engine = HFEngine(model, tok, batch_size=batch_size)
        out = []
        for start in range(0, len(ids), batch_size):
            chunk = slice(start, start + batch_size)
            out.extend(engine.generate(ids[chunk], params, vision[chunk]))
        return [g[0] for g in out]

    one, four = run(1), run(4)
    for a, b in zip(one, four, strict=True):
        assert a.token_ids == b.token_ids
        assert a.finish_reason == b.finish_reason
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < LOGPROB_TOL
    # the image decides the reply: both endings occur, in one batch of four
    assert {c.text for c, colour in zip(one, colours, strict=True) if colour == "red"} == {"xyz"}
    assert all(
        c.finish_reason == "length" for c, col in zip(one, colours, strict=True) if col == "blue"
    )


def test_vision_tokens_are_never_sampled(tiny_vlm_dir) -> None:
    """A reply holding an image placeholder would break the next forward pass (the model reads
    it as an image): the engine suppresses the vision tokens, which the model itself prefers."""
    from rlvr.data.multimodal import render_multimodal_rows, vision_token_ids
    from rlvr.model.vlm import load_policy_model

    model, tok, processor = load_policy_model(str(tiny_vlm_dir))
    vision_ids = vision_token_ids(model.config)
    assert processor.image_token_id in vision_ids and len(vision_ids) == 4
    with torch.no_grad():  # make the vision tokens the model's favourite replies
        model.lm_head.weight[vision_ids] *= 50
    rows = _image_rows(["red", "blue"], [56, 28], IMAGE_QUESTIONS[:2])
    texts, ids, vision = render_multimodal_rows(rows, processor)
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)
    replies = [g[0].token_ids for g in HFEngine(model, tok).generate(ids, params, vision)]
    assert all(len(r) == 6 and not set(r) & set(vision_ids) for r in replies)
    # transformers' own generate, without the suppression, does emit them
    one = processor(text=texts[:1], images=rows[0]["images"], return_tensors="pt")
    raw = model.generate(**one, max_new_tokens=6, do_sample=False)[0, len(ids[0]) :].tolist()
    assert set(raw) & set(vision_ids)
