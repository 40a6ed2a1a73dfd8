"""Running each distinct prompt of a micro-batch once: the same log-probs and gradient as the
whole pass, fewer positions through the model, and the same update in a real training step."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.training.test_train_e2e import one_float32_step

from rlvr.model.attention import GROUPED_EAGER, PACKED_SDPA
from rlvr.model.forward import build_sequence_batch, completion_outputs, sequence_logprobs
from rlvr.model.shared_prompt import shared_prompt_rows
from rlvr.training.tiny import build_char_tokenizer, build_tiny_model


def record_positions(model: torch.nn.Module) -> list[tuple[int, int]]:
    """The ``[rows, positions]`` shape of every pass through ``model``'s first decoder layer
    from now on."""
    seen: list[tuple[int, int]] = []

    def note(_module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        seen.append(tuple(hidden.shape[:2]))

    model.get_decoder().layers[0].register_forward_pre_hook(note, with_kwargs=True)
    return seen


def rows_of_two_prompts(tok):
    """Five rows: prompt A (7 tokens) three times, prompt B (4 tokens) twice, with completions
    of 3, 0, 5, 1 and 2 tokens (an empty one and a one-token one among them)."""
    a, b = tok("Sum 2+2").input_ids, tok("Hi!!").input_ids
    prompts = [a, a, b, a, b]
    comps = [tok(s).input_ids if s else [] for s in ("4!!", "", "hello", "x", "ok")]
    return prompts, comps


@pytest.mark.parametrize("attention", ["eager", "sdpa", GROUPED_EAGER, PACKED_SDPA])
def test_shared_prompts_give_each_sequences_own_logprobs_and_gradient(attention):
    tok = build_char_tokenizer()
    prompts, comps = rows_of_two_prompts(tok)
    assert (len(prompts[0]), len(prompts[2])) == (7, 4)
    grads, logps = {}, {}
    for share in (False, True):
        model = build_tiny_model(tok, seed=3).train()
        model.set_attn_implementation(attention)
        seen = record_positions(model)
        sb = build_sequence_batch(prompts, comps, tok.pad_token_id, share_prompt=share)
        lp, _ = sequence_logprobs(model, sb, temperature=0.7)
        (lp * sb.completion_mask).sum().backward()
        grads[share] = torch.cat([p.grad.flatten() for p in model.parameters()])
        logps[share] = lp.detach()
        if share:
            assert len(sb.prompt_firsts) == 2  # A and B
            prompts_part = sb.input_ids[:, :7]
            assert prompts_part[sb.prompt_firsts][sb.prompt_copies].equal(prompts_part)
            # the prompts but their last token once each, then every row from its last prompt
            # token: padded to the longest (5 positions), or under GROUPED_EAGER only the real
            # ones packed into one row (3 + 0 + 5 + 1 + 2: training/packed_rows.py); the same
            # under PACKED_SDPA (SDPA on the rows laid out inside attention)
            rows = [(1, 11)] if attention in (GROUPED_EAGER, PACKED_SDPA) else [(5, 5)]
            assert seen == [(2, 6), *rows]
        else:
            assert sb.prompt_firsts is None
            assert seen == [(5, 7 + 5)]
    mask = build_sequence_batch(prompts, comps, tok.pad_token_id).completion_mask.bool()
    # each completion token against a forward over its sequence alone, no padding
    model = build_tiny_model(tok, seed=3).eval()
    for i, (p, c) in enumerate(zip(prompts, comps, strict=True)):
        if not c:
            continue
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + c])).logits[0] / 0.7
        naive = F.log_softmax(logits, -1)[len(p) - 1 : len(p) + len(c) - 1]
        naive = naive.gather(-1, torch.tensor(c).unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(logps[True][i, : len(c)], naive, atol=2e-5, rtol=0)
    torch.testing.assert_close(logps[True][mask], logps[False][mask], atol=2e-5, rtol=0)
    assert grads[False].norm() > 0
    assert (grads[True] - grads[False]).norm() / grads[False].norm() < 1e-5


@pytest.mark.parametrize("attention", ["eager", GROUPED_EAGER, PACKED_SDPA])
def test_a_critics_hidden_states_are_the_whole_passes(attention):
    """PPO's value head reads the last hidden state at every completion position; packed
    (GROUPED_EAGER), the logits are the real tokens' only and the hidden states laid out."""
    tok = build_char_tokenizer()
    prompts, comps = rows_of_two_prompts(tok)
    out, seen = {}, {}
    for share in (False, True):
        model = build_tiny_model(tok, seed=3).train()
        model.set_attn_implementation(attention)
        seen[share] = record_positions(model)
        sb = build_sequence_batch(prompts, comps, tok.pad_token_id, share_prompt=share)
        out[share] = completion_outputs(model, sb, hidden_states=True)
    packed = attention in (GROUPED_EAGER, PACKED_SDPA)
    assert seen[True] == [(2, 6), (1, 11) if packed else (5, 5)] and seen[False] == [(5, 12)]
    mask = sb.completion_mask.bool()
    (full_logits, full_hidden), (logits, hidden) = out[False], out[True]
    assert logits.shape == ((11, full_logits.shape[-1]) if packed else full_logits.shape)
    torch.testing.assert_close(
        logits if packed else logits[mask], full_logits[mask], atol=2e-5, rtol=0
    )
    assert hidden.shape == full_hidden.shape
    torch.testing.assert_close(hidden[mask], full_hidden[mask], atol=2e-5, rtol=0)
    if packed:  # nothing at the padding
        assert hidden[~mask].abs().sum() == 0


def test_gradient_checkpointing_runs_every_row_whole():
    """transformers drops the cache under gradient checkpointing: the pass must not rely on it."""
    tok = build_char_tokenizer()
    prompts, comps = rows_of_two_prompts(tok)
    model = build_tiny_model(tok, seed=3).train()
    model.gradient_checkpointing_enable()
    seen = record_positions(model)
    sb = build_sequence_batch(prompts, comps, tok.pad_token_id, share_prompt=True)
    assert sb.prompt_firsts is not None
    lp, _ = sequence_logprobs(model, sb)
    (lp * sb.completion_mask).sum().backward()
    assert seen[0] == (5, 12)  # one whole pass (the backward recomputes it: more of the same)
    assert all(s == (5, 12) for s in seen)


def test_nothing_is_shared_without_a_repeat_or_before_a_one_token_prompt():
    ids = torch.tensor([[1, 2, 9], [3, 4, 9], [5, 6, 8]])
    mask = torch.ones_like(ids)
    assert shared_prompt_rows(ids, mask, 2) == (None, None)  # prompts [1, 2], [3, 4], [5, 6]
    ids[2, :2] = torch.tensor([1, 2])  # row 2 now repeats row 0's prompt (not its completion)
    firsts, copies = shared_prompt_rows(ids, mask, 2)
    assert firsts.tolist() == [0, 1] and copies.tolist() == [0, 1, 0]
    assert shared_prompt_rows(ids, mask, 1) == (None, None)  # one token: nothing before it


def test_a_training_step_is_the_same_with_shared_prompts(tiny_model_dir, tmp_path):
    """One Dr.GRPO step with and without ``algo.share_prompt`` (float32, same rollouts): the
    weights after the update agree to rounding, and the shared run put fewer positions through
    the model."""
    weights, positions = {}, {}
    for share in (False, True):
        metrics, weights[share], seen = one_float32_step(
            tiny_model_dir,
            tmp_path / str(share),
            "algo.group_size=4",
            "algo.prompts_per_step=4",
            "algo.micro_batch_size=4",
            f"algo.share_prompt={str(share).lower()}",
            before=lambda trainer: record_positions(trainer.model),
        )
        assert metrics["grad_norm"] > 0
        # every forward pass of the step (the decoding ones alike in both runs)
        positions[share] = sum(r * t for r, t in seen)
    for k, v in weights[False].items():
        # Adam's first step moves each weight by ~lr = 1e-2 whatever its gradient's size: a
        # weight whose gradient is ~0 can differ by rounding, a wrong token by ~1e-2
        torch.testing.assert_close(weights[True][k], v, rtol=0, atol=1e-4, msg=k)
    assert 0 < positions[True] < positions[False]


def test_a_vision_language_model_shares_a_text_prompt(tiny_vlm_dir):
    """Text-only prompts on a VLM (Qwen2-VL's classes) take the shared pass, with the whole
    pass's log-probs and gradient."""
    from transformers import AutoModelForImageTextToText

    from rlvr.model.vlm import load_processor

    tok = load_processor(tiny_vlm_dir).tokenizer
    prompts, comps = rows_of_two_prompts(tok)
    grads, logps, seen = {}, {}, {}
    for share in (False, True):
        model = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir).train()
        seen[share] = record_positions(model)
        sb = build_sequence_batch(prompts, comps, tok.pad_token_id, share_prompt=share)
        lp, _ = sequence_logprobs(model, sb)
        (lp * sb.completion_mask).sum().backward()
        grads[share] = torch.cat(
            [p.grad.flatten() for p in model.parameters() if p.grad is not None]
        )
        logps[share] = lp.detach()
    assert len(seen[True]) == 2 and len(seen[False]) == 1  # the prompt pass, then the rows
    mask = sb.completion_mask.bool()
    torch.testing.assert_close(logps[True][mask], logps[False][mask], atol=2e-5, rtol=0)
    assert (grads[True] - grads[False]).norm() / grads[False].norm() < 1e-5
