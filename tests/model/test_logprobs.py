"""Log-probs: alignment is checked, and the fast path equals a naive full forward."""

import pytest
import torch
import torch.nn.functional as F

from rlvr.model.attention import choose_attention
from rlvr.model.forward import build_sequence_batch, sequence_logprobs
from rlvr.model.logprobs import logprobs_and_entropy
from rlvr.training.tiny import build_char_tokenizer, build_tiny_model


def test_misaligned_logits_and_labels_raise():
    logits = torch.randn(2, 5, 11)
    labels = torch.zeros(2, 4, dtype=torch.long)  # shifted by one: one column short
    with pytest.raises(ValueError, match="shape mismatch"):
        logprobs_and_entropy(logits, labels)


def test_logprobs_hand_values():
    # logits [0, ln 3] -> probs [1/4, 3/4]; label 1 -> log(3/4), label 0 -> log(1/4)
    logits = torch.tensor([[[0.0, torch.log(torch.tensor(3.0))]] * 2])
    labels = torch.tensor([[1, 0]])
    lp, ent = logprobs_and_entropy(logits, labels)
    assert torch.allclose(lp, torch.log(torch.tensor([[0.75, 0.25]])), atol=1e-6)
    # entropy of (1/4, 3/4) = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.5623
    assert torch.allclose(ent, torch.full((1, 2), 0.562335), atol=1e-5)


def test_sequence_batch_layout():
    sb = build_sequence_batch([[5, 6, 7], [8]], [[1, 2], [3, 4, 9]], pad_id=0)
    # prompts left-padded to 3, completions right-padded to 3
    assert sb.input_ids.tolist() == [[5, 6, 7, 1, 2, 0], [0, 0, 8, 3, 4, 9]]
    assert sb.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert sb.position_ids.tolist()[1][2:] == [0, 1, 2, 3]
    assert sb.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1]]


def test_fast_logprobs_equal_naive_unpadded_forward():
    """Each completion's log-probs from the padded, logits_to_keep path equal a forward over that
    sequence alone (no padding), taking logits[t-1] for token t."""
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, seed=3).eval()
    prompts = [tok("What is 2+2?").input_ids, tok("Hi").input_ids]
    comps = [tok("4!").input_ids, tok("hello there").input_ids]
    sb = build_sequence_batch(prompts, comps, tok.pad_token_id)
    with torch.no_grad():
        fast, _ = sequence_logprobs(model, sb, temperature=0.7)
        for i, (p, c) in enumerate(zip(prompts, comps, strict=True)):
            ids = torch.tensor([p + c])
            logits = model(input_ids=ids).logits[0] / 0.7
            naive = F.log_softmax(logits, -1)[len(p) - 1 : len(p) + len(c) - 1]
            naive = naive.gather(-1, torch.tensor(c).unsqueeze(-1)).squeeze(-1)
            assert torch.allclose(fast[i, : len(c)], naive, atol=1e-5)


@pytest.mark.parametrize(
    ("requested", "device", "new_tokens", "expected"),
    [
        ("auto", "cpu", 256, "eager"),  # short replies on the CPU: eager's backward is faster
        ("auto", "cpu", 257, "sdpa"),  # long ones: no T x T score matrices kept per head
        ("auto", "cuda", 64, "sdpa"),
        ("sdpa", "cpu", 64, "sdpa"),  # an explicit choice always wins
        ("eager", "cuda", 4096, "eager"),
    ],
)
def test_choose_attention(requested, device, new_tokens, expected):
    assert choose_attention(requested, device, new_tokens) == expected


def test_eager_and_sdpa_attention_give_the_same_logprobs_and_gradients():
    """The kernel 'auto' picks changes speed, not the policy: padded batch, both implementations."""
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(tok)
    sb = build_sequence_batch([[5, 6, 7, 8], [9]], [[1, 2, 3], [4]], pad_id=tok.pad_token_id)
    out = {}
    for impl in ("eager", "sdpa"):
        model.set_attn_implementation(impl)
        model.zero_grad()
        lp, _ = sequence_logprobs(model, sb)
        (lp * sb.completion_mask).sum().backward()
        out[impl] = (lp.detach(), model.lm_head.weight.grad.clone())
    torch.testing.assert_close(out["eager"][0], out["sdpa"][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(out["eager"][1], out["sdpa"][1], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_grouped_eager_is_eagers_arithmetic(arch):
    """3 query heads per key/value head, padded batch: the grouped kernel gives eager's
    log-probs and gradients up to float32 summation order (the same dot products, mask and
    softmax; eager's backward sums the repeated heads in another order). A wrong head-to-group
    mapping or mask moves log-probs by far more (tenths of a nat)."""
    from rlvr.model.attention import GROUPED_EAGER

    tok = build_char_tokenizer()
    model = build_tiny_model(tok, arch=arch, hidden=96, heads=6, kv_heads=2, seed=1)
    sb = build_sequence_batch([[5, 6, 7, 8], [9]], [[1, 2, 3], [4]], pad_id=tok.pad_token_id)
    out = {}
    for impl in ("eager", GROUPED_EAGER):
        model.set_attn_implementation(impl)
        model.zero_grad()
        lp, _ = sequence_logprobs(model, sb)
        (lp * sb.completion_mask).sum().backward()
        k_grad = model.model.layers[0].self_attn.k_proj.weight.grad
        out[impl] = (lp.detach(), k_grad.clone())
    # measured 4.8e-7 (float32 rounding: the matmul blocks the stacked heads differently)
    torch.testing.assert_close(out["eager"][0], out[GROUPED_EAGER][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(out["eager"][1], out[GROUPED_EAGER][1], rtol=1e-5, atol=1e-7)
    assert out["eager"][1].abs().max() > 1e-3  # the keys did get a gradient


def test_training_attention_is_grouped_eager_for_text_models(tiny_vlm_dir):
    """'auto' on the CPU with short replies means eager arithmetic: the grouped kernel on a text
    model, transformers' eager on a vision-language model; an explicit sdpa is SDPA, on a text
    model as PACKED_SDPA (which also takes the packed update's layout), else transformers'."""
    from rlvr.config import load_config
    from rlvr.model.attention import GROUPED_EAGER, PACKED_SDPA, use_training_attention

    tok = build_char_tokenizer()
    model = build_tiny_model(tok)
    use_training_attention(model, load_config(None, []), "cpu")
    assert model.config._attn_implementation == GROUPED_EAGER
    use_training_attention(model, load_config(None, ["model.attention=sdpa"]), "cpu")
    assert model.config._attn_implementation == PACKED_SDPA
    use_training_attention(model, load_config(None, []), "cuda")  # auto on a GPU
    assert model.config._attn_implementation == PACKED_SDPA
    from rlvr.model.vlm import load_policy_model

    vlm = load_policy_model(str(tiny_vlm_dir))[0]
    use_training_attention(vlm, load_config(None, []), "cpu")
    assert vlm.config._attn_implementation == "eager"
    use_training_attention(vlm, load_config(None, ["model.attention=sdpa"]), "cpu")
    assert vlm.config._attn_implementation == "sdpa"


def test_logprobs_does_not_import_forward():
    """forward.py reads its log-probs from logprobs.py; logprobs.py names the two fields it
    reads of a batch (``CompletionRows``) instead of importing forward.py back: no circle,
    not even under TYPE_CHECKING."""
    import grimp

    graph = grimp.build_graph("rlvr")
    assert graph.find_shortest_chain("rlvr.model.logprobs", "rlvr.model.forward") is None
    assert graph.find_shortest_chain("rlvr.model.forward", "rlvr.model.logprobs")


def test_grouped_eager_applies_gemma2s_attention_softcapping():
    """Gemma-2 caps its attention scores (cap * tanh(s / cap)) and passes the cap to the
    attention function as ``softcap``: the grouped kernel must apply it as transformers' eager
    does. A small cap and large q/k weights make the cap bite (0.285 nats without it)."""
    import transformers as tf

    from rlvr.model.attention import GROUPED_EAGER

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    cfg = tf.Gemma2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=8,
        attn_logit_softcapping=0.05,
        max_position_embeddings=64,
    )
    model = tf.Gemma2ForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
            layer.self_attn.k_proj.weight.mul_(8.0)
    sb = build_sequence_batch([[5, 6, 7, 8], [9]], [[1, 2, 3], [4]], pad_id=tok.pad_token_id)
    out = {}
    for impl in ("eager", GROUPED_EAGER):
        model.set_attn_implementation(impl)
        lp, _ = sequence_logprobs(model, sb)
        out[impl] = lp.detach() * sb.completion_mask
    torch.testing.assert_close(out["eager"], out[GROUPED_EAGER], rtol=0, atol=1e-5)


def test_a_model_that_caps_attention_scores_trains_with_eager_arithmetic():
    """SDPA cannot softcap: 'auto' off the CPU (or an explicit sdpa) on a Gemma-2 would fail at
    set_attn_implementation; such a model trains with the grouped eager kernel instead."""
    import transformers as tf

    from rlvr.config import load_config
    from rlvr.model.attention import GROUPED_EAGER, use_training_attention

    cfg = tf.Gemma2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=8,
        attn_logit_softcapping=50.0,
        max_position_embeddings=64,
    )
    model = tf.Gemma2ForCausalLM(cfg)
    use_training_attention(model, load_config(None, ["model.attention=sdpa"]), "cpu")
    assert model.config._attn_implementation == GROUPED_EAGER


def _tiny_with_sinks(family: str, vocab: int):
    """Tiny random models whose own eager attention computes more than eager's product, mask
    and softmax: GPT-OSS (a learned sink logit per head in the softmax), Granite-SWA (the output
    scaled by sigmoid(logsumexp - sink)), Flint (sinks, and the scores in float32)."""
    import transformers as tf

    small = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    if family == "gpt_oss":
        cfg = tf.GptOssConfig(head_dim=8, num_local_experts=4, num_experts_per_tok=2, **small)
        model = tf.GptOssForCausalLM(cfg)
    elif family == "granite_swa":
        model = tf.GraniteSWAForCausalLM(tf.GraniteSWAConfig(sliding_window=4, **small))
    else:
        cfg = tf.FlintConfig(
            head_dim=8,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            **small,
        )
        model = tf.FlintForCausalLM(cfg)
    with torch.no_grad():  # sinks far from their initial value, so that they bite
        for name, p in model.named_parameters():
            if "sinks" in name:
                p.normal_(0.0, 2.0, generator=torch.Generator().manual_seed(3))
    return model.float()


@pytest.mark.parametrize("family", ["gpt_oss", "granite_swa", "flint"])
@pytest.mark.parametrize("share", [False, True])
def test_grouped_eager_computes_what_the_models_own_eager_does(family, share):
    """A model whose eager attention has attention sinks (GPT-OSS, Granite-SWA, Flint; also
    DeepSeek-V4, MiMo-V2-Flash, Inkling-2): the grouped kernel must not drop them. It dropped
    them: log-probs off by 0.021 (GPT-OSS), 0.048 (Granite-SWA), 0.018 nats (Flint) on these
    tiny models, in the padded pass and in the shared-prompt packed pass alike, and the sinks
    got no gradient."""
    from rlvr.model.attention import GROUPED_EAGER

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = _tiny_with_sinks(family, len(tok))
    prompts, comps = (
        [[5, 6, 7, 8, 9, 10], [5, 6, 7, 8, 9, 10], [11]],
        [[1, 2, 3, 12], [4], [13, 14]],
    )
    out = {}
    for impl in ("eager", GROUPED_EAGER):
        model.set_attn_implementation(impl)
        sb = build_sequence_batch(prompts, comps, pad_id=tok.pad_token_id, share_prompt=share)
        model.zero_grad()
        lp, _ = sequence_logprobs(model, sb)
        (lp * sb.completion_mask).sum().backward()
        sinks = next(p for n, p in model.named_parameters() if "sinks" in n)
        # None where the kernel leaves the sinks out of its arithmetic
        grad = torch.zeros_like(sinks) if sinks.grad is None else sinks.grad.clone()
        out[impl] = (lp.detach() * sb.completion_mask, grad)
    torch.testing.assert_close(out["eager"][0], out[GROUPED_EAGER][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(out["eager"][1], out[GROUPED_EAGER][1], rtol=1e-4, atol=1e-6)
    assert out["eager"][1].abs().max() > 1e-4  # the sinks are in the arithmetic


def test_a_model_without_sdpa_trains_with_eager_arithmetic():
    """GPT-OSS declares no SDPA support (its sinks): 'auto' off the CPU or an explicit sdpa
    failed at set_attn_implementation with transformers' error; it trains with eager's
    arithmetic instead, as Gemma-2 does."""
    from rlvr.config import load_config
    from rlvr.model.attention import GROUPED_EAGER, use_training_attention

    model = _tiny_with_sinks("gpt_oss", 64)
    for device, attention in (("cpu", "sdpa"), ("cuda", "auto")):
        use_training_attention(model, load_config(None, [f"model.attention={attention}"]), device)
        assert model.config._attn_implementation == GROUPED_EAGER
