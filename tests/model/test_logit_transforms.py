"""What a model's forward does to its head's output, in the chunks too: Gemma-2/Gemma-3 final
softcapping (cap * tanh(x / cap)), Granite's logits_scaling (x / s), Cohere's logit_scale
(x * s); Llama and Qwen2 (nothing) as controls. ``sequence_logprobs`` gives the same numbers
for every ``chunk_tokens`` (docs/DESIGN.md): the chunked log-probs, entropies and every
gradient equal the full path's, which is the model's own forward. A forward whose
post-processing rlvr does not recognise takes the full path, with one warning naming why."""

from __future__ import annotations

import logging

import pytest
import torch
import transformers as tf
from tests.model.test_chunked_policy import assert_equal, run_both
from tests.model.test_shared_prompt import rows_of_two_prompts
from transformers.modeling_utils import slice_logits_to_keep

from rlvr.model.forward import build_sequence_batch, policy_outputs, sequence_logprobs
from rlvr.model.logit_transform import LogitTransform, logit_transform
from rlvr.training.tiny import build_char_tokenizer

SMALL = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=64,
)


def _gemma_kw() -> dict:
    # head_dim set: Gemma's default (256) would make the tiny model's attention huge
    return dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=8)


# (config, model class, what the forward does to the head's output): every transform is far
# from the identity at these scales (random tiny models give logits of a few units)
FAMILIES = {
    "gemma2": lambda v: tf.Gemma2ForCausalLM(
        tf.Gemma2Config(vocab_size=v, final_logit_softcapping=0.5, **_gemma_kw(), **SMALL)
    ),
    "gemma3_text": lambda v: tf.Gemma3ForCausalLM(
        tf.Gemma3TextConfig(vocab_size=v, final_logit_softcapping=0.5, **_gemma_kw(), **SMALL)
    ),
    "granite": lambda v: tf.GraniteForCausalLM(
        tf.GraniteConfig(vocab_size=v, logits_scaling=4.0, **SMALL)
    ),
    "cohere": lambda v: tf.CohereForCausalLM(
        tf.CohereConfig(vocab_size=v, logit_scale=3.0, **SMALL)
    ),
    "llama": lambda v: tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=v, **SMALL)),
    "qwen2": lambda v: tf.Qwen2ForCausalLM(tf.Qwen2Config(vocab_size=v, **SMALL)),
}


def _make(family: str, tok):
    def build():
        torch.manual_seed(0)
        model = FAMILIES[family](len(tok)).train()
        with torch.no_grad():  # logits of several units, so the transforms bite
            model.get_output_embeddings().weight.normal_(0.0, 1.0)
        return model

    return build


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("share", [False, True])
def test_chunked_log_probs_entropies_and_gradients_equal_the_full_path(family, share):
    """Five rows of two prompts (padded, or shared prompt + packed completions), temperature
    0.7, chunks of 4 tokens, the entropy bonus: the chunked path's numbers are the model's."""
    tok = build_char_tokenizer()
    prompts, comps = rows_of_two_prompts(tok)
    sb = build_sequence_batch(prompts, comps, tok.pad_token_id, share_prompt=share)
    chunked, full = run_both(_make(family, tok), sb)
    assert_equal(chunked, full)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sequence_logprobs_is_the_same_for_every_chunk_size(family):
    tok = build_char_tokenizer()
    prompts, comps = rows_of_two_prompts(tok)
    sb = build_sequence_batch(prompts, comps, tok.pad_token_id)
    model = _make(family, tok)()
    real = sb.completion_mask.bool()
    with torch.no_grad():
        full, _ = sequence_logprobs(model, sb, chunk_tokens=0)
        for chunk in (1, 3, 1024):
            got, _ = sequence_logprobs(model, sb, chunk_tokens=chunk)
            assert torch.allclose(got[real], full[real], rtol=1e-5, atol=1e-5), chunk


def test_the_steps_read_from_each_forward():
    """What each family's forward does after its head, read from transformers' source on the
    instance: the numbers are the config's (a config without softcapping: nothing)."""
    tok = build_char_tokenizer()
    want = {
        "gemma2": (("div", 0.5), ("tanh", None), ("mul", 0.5)),
        "gemma3_text": (("div", 0.5), ("tanh", None), ("mul", 0.5)),
        "granite": (("div", 4.0),),
        "cohere": (("mul", 3.0),),
        "llama": (),
        "qwen2": (),
    }
    for family, steps in want.items():
        model = _make(family, tok)()
        assert logit_transform(model, model.get_output_embeddings()) == LogitTransform(steps)
    plain = tf.Gemma2ForCausalLM(
        tf.Gemma2Config(vocab_size=40, final_logit_softcapping=None, **_gemma_kw(), **SMALL)
    )
    assert logit_transform(plain, plain.lm_head) == LogitTransform(())
    # HyperCLOVAX multiplies by its logits_scaling in the head's own line
    hcx = tf.HyperCLOVAXForCausalLM(
        tf.HyperCLOVAXConfig(vocab_size=40, logits_scaling=0.25, **SMALL)
    )
    assert logit_transform(hcx, hcx.lm_head) == LogitTransform((("mul", 0.25),))


class _MaskingLlama(tf.LlamaForCausalLM):
    """A forward rlvr does not know: it masks a token out of its logits after the head."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs):
        kwargs.pop("return_dict", None)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **{k: v for k, v in kwargs.items() if k in ("use_cache", "output_hidden_states")},
        )
        hidden_states = outputs.last_hidden_state
        keep = kwargs.get("logits_to_keep", 0)
        if isinstance(keep, int):
            hidden_states = hidden_states[:, -keep:, :]
        else:
            hidden_states = hidden_states[:, keep, :]
        logits = self.lm_head(hidden_states)
        logits[..., 5] = -30.0
        return tf.modeling_outputs.CausalLMOutputWithPast(
            logits=logits, hidden_states=outputs.hidden_states
        )


def test_an_unrecognised_forward_takes_the_full_path_with_one_warning(caplog):
    """A forward that masks token 5, and MiniCPM3 (it divides its hidden states before the
    head): the chunked setting reads full logits (the model's own numbers, the masked token's
    -30 included), and one warning says why, however often the model runs."""
    tok = build_char_tokenizer()
    prompts, comps = rows_of_two_prompts(tok)
    comps[0] = [5, *comps[0]]  # the masked token is among the completions
    sb = build_sequence_batch(prompts, comps, tok.pad_token_id)

    def masking():
        torch.manual_seed(0)
        return _MaskingLlama(tf.LlamaConfig(vocab_size=len(tok), **SMALL)).train()

    def minicpm3():
        torch.manual_seed(0)
        # multi-head latent attention: as many K/V heads as query heads
        small = dict(SMALL, num_key_value_heads=2)
        config = tf.MiniCPM3Config(vocab_size=len(tok), scale_emb=1, dim_model_base=8, **small)
        return tf.MiniCPM3ForCausalLM(config).train()

    for make, says in ((masking, "`logits[..., 5] = -30.0`"), (minicpm3, "before its head")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rlvr.model.logit_transform"):
            model = make()
            for _ in range(2):
                policy, _ = policy_outputs(model, sb, chunk_tokens=4)
                assert policy.logits is not None  # the full path
        if make is masking:  # token 5 under the mask: the model's own logits
            assert policy.logprobs(sb)[0][0, 0].item() < -25
        warned = [r.getMessage() for r in caplog.records]
        assert len(warned) == 1 and says in warned[0], warned
        assert type(model).__name__ in warned[0] and "full-logits path" in warned[0]
        chunked, full = run_both(make, sb, chunks=False)
        assert_equal(chunked, full)


def test_softcapping_under_autocast_and_under_lora():
    """Gemma-2 under bf16 autocast (the cap's division, tanh and product in bf16 as the
    forward does them) and with LoRA adapters (peft's wrapper read through)."""
    from rlvr.config.lora import LoraConfig
    from rlvr.model.lora import apply_lora

    tok = build_char_tokenizer()
    prompts, comps = rows_of_two_prompts(tok)
    sb = build_sequence_batch(prompts, comps, tok.pad_token_id)
    chunked, full = run_both(_make("gemma2", tok), sb, autocast=True, entropy_grad=False)
    assert float((chunked[0] - full[0]).abs().max()) < 1e-4
    for name, g in full[2].items():
        rel = float((chunked[2][name] - g).abs().max() / g.abs().max())
        assert rel < 2e-2, name

    def lora():
        model = apply_lora(_make("gemma2", tok)(), LoraConfig(enabled=True, rank=2))
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.1, generator=torch.Generator().manual_seed(7))
        return model.train()

    chunked, full = run_both(lora, sb)
    assert all("lora_" in n for n in full[2])
    assert_equal(chunked, full)


class _ReturnScaledLlama(tf.LlamaForCausalLM):
    """A forward whose post-processing rlvr's reader cannot see as a write of ``logits``: the
    head's output is halved in the output's own ``logits=`` (style 'return'), or in place
    through a call whose result is bound to another name (style 'inplace')."""

    style = "return"

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs):
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **{k: v for k, v in kwargs.items() if k in ("use_cache", "output_hidden_states")},
        )
        hidden_states = outputs.last_hidden_state
        hidden_states = slice_logits_to_keep(hidden_states, kwargs.get("logits_to_keep", 0))
        logits = self.lm_head(hidden_states)
        if self.style == "return":
            return tf.modeling_outputs.CausalLMOutputWithPast(
                logits=logits * 0.5, hidden_states=outputs.hidden_states
            )
        _ = logits.mul_(0.5)
        return tf.modeling_outputs.CausalLMOutputWithPast(
            logits=logits, hidden_states=outputs.hidden_states
        )


@pytest.mark.parametrize("style", ["return", "inplace"])
def test_a_transform_outside_a_logits_assignment_takes_the_full_path(style, caplog):
    """The head's output halved in the returned ``logits=`` or by an in-place call bound to
    another name: the reader saw neither (only statements that assign ``logits``), so the
    chunks skipped the halving (log-probs off by 15.5 nats on this tiny model); such a forward
    must take the full path."""
    tok = build_char_tokenizer()
    prompts, comps = rows_of_two_prompts(tok)
    sb = build_sequence_batch(prompts, comps, tok.pad_token_id)

    def make():
        torch.manual_seed(0)
        cls = type(f"_Halving{style}", (_ReturnScaledLlama,), {"style": style})
        model = cls(tf.LlamaConfig(vocab_size=len(tok), **SMALL)).train()
        with torch.no_grad():
            model.lm_head.weight.normal_(0.0, 1.0)
        return model

    with caplog.at_level(logging.WARNING, logger="rlvr.model.logit_transform"):
        chunked, full = run_both(make, sb, chunks=False)
    assert_equal(chunked, full)
