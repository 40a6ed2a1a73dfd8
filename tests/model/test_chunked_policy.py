"""The chunked log-probs through the model's own passes (``policy_outputs``): padded, shared
prompt packed, tied and untied heads, LoRA (head frozen; a LoRA head takes the full path),
autocast, a VLM: the full-logits path's values and gradients."""

from __future__ import annotations

import pytest
import torch
from tests.model.test_shared_prompt import rows_of_two_prompts

from rlvr.config.lora import LoraConfig
from rlvr.model.attention import GROUPED_EAGER
from rlvr.model.forward import build_sequence_batch, policy_outputs
from rlvr.model.lora import apply_lora
from rlvr.training.tiny import build_char_tokenizer, build_tiny_model


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def run_both(
    make_model, sb, *, temperature=0.7, chunk=4, autocast=False, entropy_grad=True, chunks=True
):
    """Log-probs, entropies (at the real tokens) and every trainable gradient, for the chunked
    and the full path, from two copies of the same model; the loss weights each token.
    ``chunks=False``: the model is one the chunked setting must run on full logits."""
    out = {}
    weights = torch.linspace(-1.0, 2.0, sb.completion_ids.numel()).view_as(sb.completion_mask)
    real = sb.completion_mask.bool()
    for chunk_tokens in (chunk, 0):
        model = make_model()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            policy, _ = policy_outputs(model, sb, chunk_tokens=chunk_tokens)
        assert (policy.logits is None) == (chunks and chunk_tokens > 0)
        logp, ent = policy.logprobs(sb, temperature, entropy_grad=entropy_grad)
        loss = (logp * weights * sb.completion_mask).sum()
        if entropy_grad:
            loss = loss - 0.1 * (ent * sb.completion_mask).sum()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        out[chunk_tokens] = (logp.detach()[real], ent.detach()[real], grads)
    return out[chunk], out[0]


def assert_equal(chunked, full, tol=1e-5):
    assert _rel(chunked[0], full[0]) < tol
    assert _rel(chunked[1], full[1]) < tol
    assert chunked[2].keys() == full[2].keys() and full[2]
    for name, g in full[2].items():
        assert _rel(chunked[2][name], g) < tol, name


@pytest.mark.parametrize("share", [False, True])
def test_padded_and_packed_passes_equal_the_full_path(share):
    """Five rows of two prompts (completions of 3, 0, 5, 1, 2 tokens) under GROUPED_EAGER: the
    padded pass, or the shared-prompt pass whose completions run packed; tied embeddings (the
    head's gradient and the embedding's are one), temperature 0.7, the entropy bonus."""
    tok = build_char_tokenizer()
    prompts, comps = rows_of_two_prompts(tok)
    sb = build_sequence_batch(prompts, comps, tok.pad_token_id, share_prompt=share)

    def make():
        model = build_tiny_model(tok, seed=3).train()
        model.set_attn_implementation(GROUPED_EAGER)
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
        return model

    assert_equal(*run_both(make, sb))


def test_an_untied_head_with_its_own_gradient():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_char_tokenizer()
    prompts, comps = rows_of_two_prompts(tok)
    sb = build_sequence_batch(prompts, comps, tok.pad_token_id)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )

    def make():
        torch.manual_seed(0)
        return Qwen2ForCausalLM(config).train()

    chunked, full = run_both(make, sb, temperature=1.0, chunk=3)
    assert "lm_head.weight" in full[2]
    assert_equal(chunked, full)


def test_lora_with_a_frozen_head_and_a_lora_head():
    """Adapters on the attention: the head is frozen, only the hidden states' gradient flows
    through the chunks. A head that is itself a LoRA target is not a plain linear layer: the
    full path runs (and gives the same numbers, being the same path)."""
    tok = build_char_tokenizer()
    prompts, comps = rows_of_two_prompts(tok)
    sb = build_sequence_batch(prompts, comps, tok.pad_token_id)

    def make(targets):
        def build():
            model = apply_lora(
                build_tiny_model(tok, seed=1), LoraConfig(enabled=True, rank=2, **targets)
            )
            for name, p in model.named_parameters():
                if "lora_B" in name:  # B starts at zero: make the adapters change the output
                    torch.nn.init.normal_(p, std=0.1, generator=torch.Generator().manual_seed(7))
            return model.train()

        return build

    chunked, full = run_both(make({}), sb)
    assert all("lora_" in n for n in full[2])
    assert_equal(chunked, full)

    lora_head = make({"target_modules": ["q_proj", "lm_head"]})()
    policy, _ = policy_outputs(lora_head, sb, chunk_tokens=4)
    assert policy.logits is not None  # the full path


def test_under_autocast_the_chunks_match_the_full_path():
    """bf16 autocast: the same bf16 matmul and division per logit; log-probs equal to float32
    rounding, gradients to bf16 rounding."""
    tok = build_char_tokenizer()
    prompts, comps = rows_of_two_prompts(tok)
    sb = build_sequence_batch(prompts, comps, tok.pad_token_id)
    chunked, full = run_both(
        lambda: build_tiny_model(tok, seed=2).train(), sb, autocast=True, entropy_grad=False
    )
    assert _rel(chunked[0], full[0]) < 1e-5
    for name, g in full[2].items():
        assert _rel(chunked[2][name], g) < 2e-2, name


def test_a_vlm_s_log_probs_equal_the_full_path(tiny_vlm_dir):
    """Qwen2-VL with an image per row: its text model's hidden states through the chunks."""
    from tests.model.test_vlm_logprobs import _rows
    from transformers import AutoModelForImageTextToText

    from rlvr.data.multimodal import collate_vision, render_multimodal_rows
    from rlvr.model.vlm import load_processor

    processor = load_processor(tiny_vlm_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir).eval()
    rows = _rows(tiny_vlm_dir.parent)
    _, prompt_ids, vision = render_multimodal_rows(rows, processor)
    comps = [[5, 6, 7], [8], [9, 10]]
    sb = build_sequence_batch(
        prompt_ids,
        comps,
        processor.tokenizer.pad_token_id,
        vision=collate_vision(vision),
        image_token_id=model.config.image_token_id,
    )
    with torch.no_grad():
        got = [policy_outputs(model, sb, chunk_tokens=c)[0].logprobs(sb, 0.8) for c in (2, 0)]
    real = sb.completion_mask.bool()
    assert _rel(got[0][0][real], got[1][0][real]) < 1e-5
    assert _rel(got[0][1][real], got[1][1][real]) < 1e-5
