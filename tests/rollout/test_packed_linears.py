"""The linear layers on oneDNN-packed weights while the hf engine decodes on a CPU
(rollout/packed_linears.py): F.linear's outputs, every linear swapped for the decoding loop alone
(the trainer's lean layers and peft's included), the originals back afterwards, and the replies
and log-probs of a run unchanged."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch import nn
from vllm_support import base_model, max_abs_diff, peft_model, trained_copy, trainer_logprobs

from rlvr.model import lean_backward
from rlvr.rollout import hf
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.hf import HFEngine
from rlvr.rollout.packed_linears import PackedLinear, packable_dtype, packed_linears, packs
from rlvr.training.tiny import build_char_tokenizer

PROMPTS = ["x", "xyz", "a b c d", "xyzxyzxy", "q", "hello world"]
needs_bf16 = pytest.mark.skipif(
    not packable_dtype(torch.bfloat16), reason="this CPU has no oneDNN bf16 path"
)


def linears(model: nn.Module) -> dict[str, nn.Module]:
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 40])
def test_packed_float32_outputs_are_f_linears(bias, rows):
    """Any number of rows (the packing is tuned for 7), a [B, T, H] input and a strided one: the
    same outputs as F.linear up to float32 rounding, bias included."""
    torch.manual_seed(0)
    lin = nn.Linear(48, 100, bias=bias)
    packed = PackedLinear(lin, torch.float32, rows=7)
    x = torch.randn(rows, 3, 48)
    with torch.no_grad():
        got, want = packed(x), lin(x)
        assert got.shape == (rows, 3, 100) and got.dtype == torch.float32
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        strided = x[:, 1]  # every third row of the storage
        torch.testing.assert_close(packed(strided), lin(strided), atol=1e-5, rtol=1e-5)
        # the packed copy is taken once: a later change to the weight is not seen
        lin.weight.zero_()
        torch.testing.assert_close(packed(x), want, atol=1e-5, rtol=1e-5)
    assert packed.weight is lin.weight and packed.bias is lin.bias
    assert not list(packed.parameters(recurse=False))


@needs_bf16
def test_packed_bf16_outputs_are_autocasts():
    """In bf16 the layer computes what F.linear does under bf16 autocast: bf16 out, the same
    values up to the accumulation order of a bf16 matmul."""
    torch.manual_seed(0)
    lin = nn.Linear(64, 96)
    x = torch.randn(5, 64)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = lin(x)
        got = PackedLinear(lin, torch.bfloat16, rows=5)(x)
    assert want.dtype == got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=1e-2)
    # and not the float32 layer's: bf16 rounding shows
    assert (got.float() - lin(x).detach()).abs().max() > 1e-4


def test_what_is_packed():
    lin = nn.Linear(8, 4)
    assert packs(lin, torch.float32) and packs(lin, torch.bfloat16)  # float32 master weights
    assert not packs(nn.Linear(8, 4).to(torch.bfloat16), torch.float32)
    assert not packs(nn.Embedding(8, 4), torch.float32)
    hooked = nn.Linear(8, 4)
    hooked.register_forward_hook(lambda *a: None)
    assert not packs(hooked, torch.float32)  # a hook (accelerate's offload, say) would be lost
    assert not packable_dtype(torch.float16)


@pytest.fixture(scope="module")
def model_tok():
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    return trained_copy(base_model(tok), tok, steps=30), tok


def test_every_linear_is_packed_for_the_block_only(model_tok):
    """Inside the block every linear (attention, MLP, the tied head) is a PackedLinear over the
    same weight and the logits are the model's own; afterwards, also after an error, each
    original module is back where it was."""
    model, tok = model_tok
    before = linears(model)
    ids = torch.tensor([tok("xyz hello", add_special_tokens=False).input_ids])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        with packed_linears(model) as n:
            inside = dict(model.named_modules())
            got = model(input_ids=ids).logits
    assert n == len(before) > 4
    for name, lin in before.items():
        assert type(inside[name]) is PackedLinear and inside[name].linear is lin
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert linears(model) == before
    with pytest.raises(RuntimeError, match="mid-decode"), packed_linears(model):
        raise RuntimeError("mid-decode")
    assert linears(model) == before
    with packed_linears(model, torch.float16) as n:  # no oneDNN fp16 path: left alone
        assert n == 0 and linears(model) == before


def test_a_packing_that_fails_part_way_puts_back_the_layers_already_swapped(model_tok, monkeypatch):
    """A reorder that raises on the fifth layer (e.g. out of memory): the error reaches the
    caller and the four layers swapped before it are the originals again."""
    model, _ = model_tok
    before = linears(model)
    made = []
    real_init = PackedLinear.__init__

    def init(self, linear, dtype, rows):
        if len(made) == 4:
            raise MemoryError("reorder")
        real_init(self, linear, dtype, rows)
        made.append(linear)

    monkeypatch.setattr(PackedLinear, "__init__", init)
    with pytest.raises(MemoryError, match="reorder"), packed_linears(model):
        pytest.fail("the block must not run")
    assert len(made) == 4
    assert linears(model) == before


def _engine_run(model, tok, monkeypatch, packed: bool, **engine_kw):
    """Sampled replies of the hf engine and how many calls went through a PackedLinear, with the
    engine's packing on or off."""
    if not packed:
        monkeypatch.setattr(hf, "packed_linears", lambda *a, **k: contextlib.nullcontext(0))
    calls = []
    orig = PackedLinear.forward
    monkeypatch.setattr(PackedLinear, "forward", lambda self, x: calls.append(1) or orig(self, x))
    ids = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS]
    params = SamplingParams(n=3, temperature=0.8, max_new_tokens=10, seed=5)
    groups = HFEngine(model, tok, **engine_kw).generate(ids, params)
    monkeypatch.undo()
    return [c for g in groups for c in g], len(calls), ids


def test_engine_decodes_on_packed_linears_with_the_same_replies(model_tok, monkeypatch):
    """The join: the hf engine's decoding runs every linear of every pass (the prefill and each
    step) packed, samples the replies the unpacked model gives, records the log-probs the trainer
    recomputes, and leaves the model's own layers in place; transformers' generate is not
    packed."""
    model, tok = model_tok
    before = linears(model)
    plain, plain_calls, ids = _engine_run(model, tok, monkeypatch, packed=False)
    packed, packed_calls, _ = _engine_run(model, tok, monkeypatch, packed=True)
    assert plain_calls == 0
    # the prefill, then one pass per token fed back (the last token sampled is not fed)
    passes = max(len(c.token_ids) for c in packed)
    assert packed_calls == len(before) * passes
    assert [c.token_ids for c in packed] == [c.token_ids for c in plain]
    assert (
        max_abs_diff([torch.tensor(c.logprobs) for c in plain], [c.logprobs for c in packed]) < 1e-5
    )
    prompts = [ids[c.prompt_index] for c in packed]
    trainer = trainer_logprobs(model, prompts, [c.token_ids for c in packed], tok.pad_token_id, 0.8)
    assert max_abs_diff(trainer, [c.logprobs for c in packed]) < 1e-4
    assert linears(model) == before
    _, generate_calls, _ = _engine_run(model, tok, monkeypatch, True, decoder="generate")
    assert generate_calls == 0


@needs_bf16
def test_engine_under_bf16_autocast_decodes_packed_in_bf16(model_tok, monkeypatch):
    """Under bf16 autocast the packed layers compute in bf16, as autocast's linears would: the
    same replies as the unpacked engine under autocast."""
    model, tok = model_tok
    plain, _, _ = _engine_run(model, tok, monkeypatch, packed=False, autocast=True)
    packed, calls, _ = _engine_run(model, tok, monkeypatch, packed=True, autocast=True)
    assert calls > 0
    assert [c.token_ids for c in packed] == [c.token_ids for c in plain]
    assert (
        max_abs_diff([torch.tensor(c.logprobs) for c in plain], [c.logprobs for c in packed]) < 0.05
    )


def test_the_trainers_lean_linears_are_packed(model_tok):
    """The trainer installs lean layers before building the engine: LeanLinear is still an
    nn.Linear over a float32 weight, so every one is packed, with the same logits."""
    model, tok = model_tok
    lean = copy.deepcopy(model)
    lean_backward.install(lean)
    before = linears(lean)
    assert any(type(m) is lean_backward.LeanLinear for m in before.values())
    ids = torch.tensor([tok("a b c", add_special_tokens=False).input_ids])
    with torch.no_grad():
        want = lean(input_ids=ids).logits
        with packed_linears(lean) as n:
            got = lean(input_ids=ids).logits
    assert n == len(before)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert linears(lean) == before


def test_a_lora_models_base_and_adapter_layers_are_packed(model_tok):
    """Under a peft adapter the base layers and the adapters' A and B are packed (peft's own
    LoRA layer calls them and reads lora_A's weight dtype through the stand-in); the logits are
    the adapted model's, and every module is back afterwards."""
    _, tok = model_tok
    model = trained_copy(peft_model(tok), tok, steps=5)  # B moves: the adapter changes outputs
    before = linears(model)
    assert any(".lora_A." in n for n in before) and any("base_layer" in n for n in before)
    ids = torch.tensor([tok("a b c", add_special_tokens=False).input_ids])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        with model.disable_adapter():
            base = model(input_ids=ids).logits
        with packed_linears(model) as n:
            got = model(input_ids=ids).logits
    assert (want - base).abs().max() > 1e-3
    assert n == len(before)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert linears(model) == before
