"""Lean layers (training/lean_backward.py): the same outputs and gradients as the standard
modules, bitwise, with less kept for the backward; and the swap's own rules."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from rlvr.model import lean_backward
from rlvr.model.lean_backward import LeanLinear
from rlvr.training.tiny import build_tiny_model

BF16 = torch.bfloat16


def autocast():
    return torch.autocast("cpu", dtype=BF16)


def grads(module: nn.Module, x: torch.Tensor, *, amp: bool, weight: torch.Tensor | None = None):
    """Output, input gradient and parameter gradients of ``sum(out * weight)``."""
    module.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    with autocast() if amp else torch.autocast("cpu", enabled=False):
        # a non-leaf input, as every layer's input in a model is: autocast caches its cast of a
        # leaf that requires grad and would sum that cast's gradients in bf16
        out = module(x * 1.0)
    w = weight if weight is not None else torch.linspace(-1, 1, out.numel()).view_as(out)
    (out.float() * w).sum().backward()
    return out.detach(), x.grad, {n: p.grad.clone() for n, p in module.named_parameters()}


def assert_same(a, b):
    out_a, gx_a, gp_a = a
    out_b, gx_b, gp_b = b
    assert out_a.dtype == out_b.dtype and torch.equal(out_a, out_b)
    assert torch.equal(gx_a, gx_b)
    assert gp_a.keys() == gp_b.keys()
    for name in gp_a:
        assert gp_a[name].dtype == gp_b[name].dtype, name
        assert torch.equal(gp_a[name], gp_b[name]), name


def saved_bytes(fn) -> dict[torch.dtype, int]:
    """Bytes of the distinct tensors autograd saves while ``fn`` runs, by dtype, leaving out
    the module's own parameters (they live anyway)."""
    seen, by_dtype = set(), {}

    def pack(t):
        key = (t.untyped_storage().data_ptr(), t.dtype)
        if key not in seen and not isinstance(t, nn.Parameter):
            seen.add(key)
            by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return by_dtype


@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_autocast_bitwise(bias):
    torch.manual_seed(0)
    std = nn.Linear(24, 40, bias=bias)
    lean = copy.deepcopy(std)
    lean.__class__ = LeanLinear
    x = torch.randn(3, 5, 24)
    assert_same(grads(std, x, amp=True), grads(lean, x, amp=True))
    # without autocast it is nn.Linear itself
    assert_same(grads(std, x, amp=False), grads(lean, x, amp=False))


def test_linear_keeps_the_float32_weight_not_a_bf16_copy():
    torch.manual_seed(0)
    std = nn.Linear(64, 256, bias=False)
    lean = copy.deepcopy(std)
    lean.__class__ = LeanLinear
    x = torch.randn(2, 3, 64, requires_grad=True)

    def run(m):
        def fn():
            with autocast():
                m(x)

        return saved_bytes(fn)

    standard, ours = run(std), run(lean)
    # autocast keeps the bf16 input (2 x 3 x 64) and the bf16 weight (256 x 64)
    assert standard == {BF16: 2 * (2 * 3 * 64) + 2 * 256 * 64}
    assert ours == {BF16: 2 * (2 * 3 * 64)}


def test_linears_reading_one_input_keep_one_cast_of_it():
    torch.manual_seed(0)
    q, k = LeanLinear(32, 32, bias=False), LeanLinear(32, 8, bias=False)
    x = torch.randn(4, 32, requires_grad=True)
    h = x * 2  # a non-leaf input, as a norm's output is

    def fn():
        with autocast():
            q(h), k(h)

    assert saved_bytes(fn) == {BF16: 2 * 4 * 32}  # one bf16 copy of h, not two


def test_the_shared_cast_lives_no_longer_than_the_backward_graph():
    lin = LeanLinear(16, 8, bias=False)
    h = torch.randn(4, 16, requires_grad=True) * 2
    with autocast():
        out = lin(h)
    assert lean_backward._InputCast.cast() is not None  # kept by the graph, for the backward
    out.float().sum().backward()
    assert lean_backward._InputCast.cast() is None  # freed with the graph, not held till later


def test_rmsnorm_matches_llama_bitwise():
    torch.manual_seed(0)
    std = LlamaRMSNorm(48, eps=1e-5)
    std.weight.data = torch.rand(48) + 0.5
    lean = copy.deepcopy(std)
    assert lean_backward.install(lean)["rmsnorm"] == 1
    x = torch.randn(3, 7, 48) * 3
    assert_same(grads(std, x, amp=False), grads(lean, x, amp=False))
    # saved: the input and 1/rms instead of the input and the normalised input
    x = x.requires_grad_()
    assert saved_bytes(lambda: std(x)) == {torch.float32: 2 * 3 * 7 * 48 * 4 + 3 * 7 * 4}
    assert saved_bytes(lambda: lean(x)) == {torch.float32: 3 * 7 * 48 * 4 + 3 * 7 * 4}


def test_gated_mlp_matches_llama_bitwise_and_drops_the_silu_output():
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=80, hidden_act="silu")
    std = LlamaMLP(cfg)
    lean = copy.deepcopy(std)
    assert lean_backward.install(lean) == {"linear": 3, "rmsnorm": 0, "mlp": 1}
    x = torch.randn(2, 5, 32)
    assert_same(grads(std, x, amp=True), grads(lean, x, amp=True))
    assert_same(grads(std, x, amp=False), grads(lean, x, amp=False))
    xr = x.clone().requires_grad_()

    def run(m):
        def fn():
            with autocast():
                m(xr * 1.0)  # non-leaf, as in a model (autocast caches a leaf's cast)

        return saved_bytes(fn)

    std_saved, lean_saved = run(std), run(lean)
    n = 2 * 5
    weights = 3 * 32 * 80 * 2  # gate, up, down in bf16
    # standard: x (bf16, once per gate/up: 2), gate, silu(gate), up, their product, weights
    assert std_saved[BF16] == 2 * (2 * n * 32 + 4 * n * 80) + weights
    # lean: x once, gate, up, the product; no bf16 weights
    assert lean_saved[BF16] == 2 * (n * 32 + 3 * n * 80)


def test_a_norm_that_computes_differently_keeps_its_class():
    class OffsetRMSNorm(nn.Module):  # Gemma-style: scales by (1 + weight)
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(16))
            self.variance_epsilon = 1e-6

        def forward(self, x):
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return (1.0 + self.weight) * h

    norm = OffsetRMSNorm()
    assert lean_backward.install(norm)["rmsnorm"] == 0
    assert type(norm) is OffsetRMSNorm


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_whole_model_same_loss_and_gradients(arch, tiny_tokenizer):
    """A tied-embedding decoder (Qwen2: biased q/k/v) under autocast: the same loss bitwise; the
    gradients bitwise except where the engine sums several paths in another order (the tied
    embedding), there within float32 rounding."""
    std = build_tiny_model(tiny_tokenizer, arch=arch, heads=4, kv_heads=2, intermediate=160)
    lean = copy.deepcopy(std)
    counts = lean_backward.install(lean)
    assert counts == {"linear": 2 * 7 + 1, "rmsnorm": 2 * 2 + 1, "mlp": 2}
    ids = torch.randint(0, len(tiny_tokenizer), (3, 11), generator=torch.Generator().manual_seed(0))
    results = []
    for m in (std, lean):
        m.zero_grad(set_to_none=True)
        with autocast():
            logits = m(input_ids=ids).logits
        loss = torch.log_softmax(logits.float(), -1)[..., 5].sum()
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in m.named_parameters()}))
    (loss_a, ga), (loss_b, gb) = results
    assert torch.equal(loss_a, loss_b)
    for name in ga:
        if name == "model.embed_tokens.weight":
            # float32 sums of the same terms in another order: a few units of rounding
            scale = float(ga[name].abs().max())
            torch.testing.assert_close(ga[name], gb[name], rtol=0, atol=1e-6 * scale)
        else:
            assert torch.equal(ga[name], gb[name]), name
    # generation (no gradient) runs the original forwards: the same logits bitwise
    with torch.no_grad(), autocast():
        assert torch.equal(std(input_ids=ids).logits, lean(input_ids=ids).logits)


# ---------------------------------------------------------------- in the training loop


def _trainer(model_dir, out, name: str, lean: bool):
    from rlvr.config import load_config
    from rlvr.training.trainer import Trainer

    return Trainer(
        load_config(
            None,
            [
                f"model.name_or_path={model_dir}",
                f"train.output_dir={out}",
                f"train.run_name={name}",
                "model.autocast=bf16",
                f"model.lean_backward={str(lean).lower()}",
                "data.template=none",
                "rollout.max_new_tokens=12",
                "reward.specs=[{name: 'toy_rewards:count_sevens'}]",
                "algo.micro_batch_size=2",  # several micro-batches: gradients accumulate
                # one forward per backward: with a shared prompt each weight serves two passes,
                # whose gradients autocast's bf16 weight copy sums in bf16 and the lean layers in
                # float32, so the two would differ by that rounding (the lean side the closer)
                "algo.share_prompt=false",
                "train.max_grad_norm=1e9",  # no clipping: a rounding in the norm moves nothing
                "train.lr=1e-3",
                "train.threads=1",
                "train.max_steps=1",
                "logging.progress=false",
                "eval.before_after=false",
            ],
        )
    )


def test_a_training_step_with_lean_layers_moves_the_weights_as_the_standard_one(
    tiny_model_dir, tmp_path
):
    """The joins: setup_run swaps the layers of the model the trainer trains (and only when
    asked), and a whole step (sample, score, micro-batched update, AdamW) lands on the same
    weights, bitwise except the tied embedding (float32 rounding, see above)."""
    before = torch.get_num_threads()
    try:
        std, lean = (_trainer(tiny_model_dir, tmp_path, n, n == "lean") for n in ("std", "lean"))
        assert not any(isinstance(m, LeanLinear) for m in std.run.model.modules())
        kinds = {type(m).__name__ for m in lean.run.model.modules()}
        assert {"LeanLinear", "LeanLlamaRMSNorm", "LeanLlamaMLP"} <= kinds
        m_std, m_lean = std.train_step(), lean.train_step()
    finally:
        torch.set_num_threads(before)
    # the same samples and rewards (same weights before the step), the same loss
    assert m_std["reward_mean"] == m_lean["reward_mean"]
    assert m_std["policy_loss"] == m_lean["policy_loss"]
    assert m_std["grad_norm"] == pytest.approx(m_lean["grad_norm"], rel=1e-6)
    a = dict(std.run.model.named_parameters())
    for name, p in lean.run.model.named_parameters():
        if name == "model.embed_tokens.weight":
            torch.testing.assert_close(p, a[name], rtol=0, atol=2e-3)  # AdamW moves <= lr
        else:
            assert torch.equal(p, a[name]), name
    # and the step did move them: the final norm's weights start at exactly one
    assert not torch.equal(a["model.norm.weight"], torch.ones_like(a["model.norm.weight"]))


def test_lean_linears_under_fsdp2_and_autocast_train_as_the_standard_ones(tiny_model_dir, tmp_path):
    """Two FSDP2 ranks (gloo) under bf16 autocast: a lean linear keeps the unsharded float32
    weight, which FSDP2 frees after the forward and gathers again before the backward. One step
    with and without lean layers lands on the same weights (the tied embedding within AdamW's
    step, as above)."""
    from dist_support import TORCHRUN, run, steps, train_args, weights

    def args(name: str, lean: bool) -> list[str]:
        return train_args(
            tiny_model_dir,
            tmp_path,
            name,
            1,
            "train.parallel=fsdp2",
            "model.autocast=bf16",
            "train.max_grad_norm=1e9",
            "train.lr=1e-3",
            f"model.lean_backward={str(lean).lower()}",
        )

    run(TORCHRUN, args("std", False), tmp_path)
    run(TORCHRUN, args("lean", True), tmp_path)
    (a,), (b,) = steps(tmp_path / "std"), steps(tmp_path / "lean")
    assert a["reward_mean"] == b["reward_mean"] and a["policy_loss"] == b["policy_loss"]
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-6)
    wa, wb = weights(tmp_path / "std" / "final"), weights(tmp_path / "lean" / "final")
    assert wa.keys() == wb.keys()
    for name in wa:
        if "embed_tokens" in name:
            torch.testing.assert_close(wa[name], wb[name], rtol=0, atol=2e-3)
        else:
            assert torch.equal(wa[name], wb[name]), name
