"""The model code on CUDA: the lean layers against transformers' own, and the shared-prompt and
packed passes against the padded pass (log-probs and gradients).

Tolerances: the lean layers are autograd's own formulas, so outputs and gradients must match
transformers' layers bitwise, as on the CPU, except the tied embedding, whose gradient sums the
same terms in another order (float32 rounding). The shared-prompt and packed passes compute
each real position with different kernel shapes (cuBLAS picks its algorithm by shape), so they
agree to rounding: float32 (TF32 off) within 1e-4 on log-probs and 1e-4 relative on the whole
gradient; bf16 autocast within 5e-2 on log-probs and 2e-2 relative on the gradient.
"""

from __future__ import annotations

import copy

import pytest
import torch
from tests.gpu.support import DEVICE

from rlvr.model import lean_backward
from rlvr.model.attention import GROUPED_EAGER, PACKED_SDPA
from rlvr.model.forward import build_sequence_batch, sequence_logprobs
from rlvr.training.tiny import build_char_tokenizer, build_tiny_model

pytestmark = pytest.mark.gpu


def autocast(enabled: bool = True):
    return torch.autocast(torch.device(DEVICE).type, dtype=torch.bfloat16, enabled=enabled)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_lean_layers_match_transformers_on_cuda(arch, tiny_tokenizer):
    std = build_tiny_model(tiny_tokenizer, arch=arch, heads=4, kv_heads=2, intermediate=160)
    std = std.to(DEVICE)
    lean = copy.deepcopy(std)
    counts = lean_backward.install(lean)
    assert counts == {"linear": 2 * 7 + 1, "rmsnorm": 2 * 2 + 1, "mlp": 2}
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, len(tiny_tokenizer), (3, 11), generator=gen).to(DEVICE)
    results = []
    for m in (std, lean):
        m.zero_grad(set_to_none=True)
        with autocast():
            logits = m(input_ids=ids).logits
        loss = torch.log_softmax(logits.float(), -1)[..., 5].sum()
        loss.backward()
        results.append(
            (logits.detach(), loss.detach(), {n: p.grad for n, p in m.named_parameters()})
        )
    (logits_a, loss_a, ga), (logits_b, loss_b, gb) = results
    assert torch.equal(logits_a, logits_b) and torch.equal(loss_a, loss_b)
    for name in ga:
        if name == "model.embed_tokens.weight":
            scale = float(ga[name].abs().max())
            torch.testing.assert_close(ga[name], gb[name], rtol=0, atol=1e-6 * scale)
        else:
            assert torch.equal(ga[name], gb[name]), name
    with torch.no_grad(), autocast():  # generation runs the original forwards
        assert torch.equal(std(input_ids=ids).logits, lean(input_ids=ids).logits)


def rows_of_two_prompts(tok):
    """Five rows: prompt A three times, prompt B twice, replies of 3, 0, 5, 1 and 2 tokens."""
    a, b = tok("Sum 2+2").input_ids, tok("Hi!!").input_ids
    comps = [tok(s).input_ids if s else [] for s in ("4!!", "", "hello", "x", "ok")]
    return [a, a, b, a, b], comps


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("attention", ["eager", "sdpa", GROUPED_EAGER, PACKED_SDPA])
def test_shared_prompt_and_packed_passes_match_the_padded_pass_on_cuda(attention, bf16):
    """The padded pass against the shared-prompt pass (packed under GROUPED_EAGER and
    PACKED_SDPA, the GPU's training attention)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tok = build_char_tokenizer()
    prompts, comps = rows_of_two_prompts(tok)
    grads, logps = {}, {}
    for share in (False, True):
        model = build_tiny_model(tok, seed=3).to(DEVICE).train()
        model.set_attn_implementation(attention)
        sb = build_sequence_batch(prompts, comps, tok.pad_token_id, share_prompt=share)
        sb = type(sb)(**{k: _to(v) for k, v in vars(sb).items()})
        with autocast(bf16):
            lp, _ = sequence_logprobs(model, sb, temperature=0.7)
        (lp * sb.completion_mask).sum().backward()
        grads[share] = torch.cat([p.grad.flatten() for p in model.parameters()])
        logps[share] = lp.detach()
        assert (sb.prompt_firsts is not None) == share
    mask = build_sequence_batch(prompts, comps, tok.pad_token_id).completion_mask.bool().to(DEVICE)
    atol, rel = (5e-2, 2e-2) if bf16 else (1e-4, 1e-4)
    torch.testing.assert_close(logps[True][mask], logps[False][mask], atol=atol, rtol=0)
    assert grads[False].norm() > 0
    assert (grads[True] - grads[False]).norm() / grads[False].norm() < rel


def _to(v):
    if isinstance(v, torch.Tensor):
        return v.to(DEVICE)
    if isinstance(v, dict):
        return {k: t.to(DEVICE) for k, t in v.items()}
    return v
