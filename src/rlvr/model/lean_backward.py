"""Layers that keep less for the backward pass, with the same arithmetic as the ones they replace.

Measured on SmolLM2-135M under bf16 autocast (one micro-batch of 8 x 86 tokens), a training
forward keeps about 1 GiB for the backward. Three parts of it are copies the backward can rebuild
for less than they cost to keep:

- **autocast's bf16 weight copies** (~270 MB for this model): ``F.linear`` under autocast casts
  each float32 weight to bf16 and the matmul keeps that copy for the backward. ``LeanLinear``
  keeps the float32 weight, which lives anyway, and casts it again in the backward (a read of
  the weights per micro-batch, ~2% of an update here). The activation it keeps is shared with
  the linears just before it that read the same input (q/k/v, gate/up): autocast casts that
  input once per linear and keeps every copy.
- **RMSNorm's normalised output** (float32, one per norm): ``LeanRMSNorm`` keeps the input and
  ``1/rms`` and recomputes ``x / rms`` in the backward.
- **SiLU's output in the gated MLP**: ``LeanGatedMLP`` keeps ``gate`` and ``up`` and recomputes
  ``silu(gate)`` in the backward.

Each backward is written as autograd's own formulas for the replaced operations, in the same
order, so the gradients equal the standard modules' (tests/test_lean_backward.py checks them
bitwise). A norm or MLP class is swapped only after a probe input gives bitwise the same
output as its own ``forward`` (a family that computes differently keeps its class). With no
gradient to compute (generation, reference passes) every layer runs its original forward.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import SiLUActivation

# -- linear ---------------------------------------------------------------------------------------


class _InputCast:
    """The last input ``LeanLinear`` cast to bf16, so consecutive linears reading the same tensor
    (q, k, v; gate, up) keep one copy. Both references are weak: the cast lives as long as a
    backward graph keeps it (every linear that uses it saves it), never longer."""

    source: weakref.ref | None = None
    version: int = -1
    cast: weakref.ref | None = None

    @classmethod
    def get(cls, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if x.dtype == dtype:
            return x
        cast = cls.cast() if cls.cast is not None else None
        same = cls.source is not None and cls.source() is x and cls.version == x._version
        if not (same and cast is not None and cast.dtype == dtype):
            cast = x.to(dtype)
            cls.source, cls.version, cls.cast = weakref.ref(x), x._version, weakref.ref(cast)
        return cast


class _RecastLinearFn(torch.autograd.Function):
    """``F.linear(x, w, b)`` computed in ``dtype`` from float32 ``w``/``b``, as autocast would,
    keeping ``w`` itself (not its low-precision copy) for the backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, dtype):
        x_low = _InputCast.get(x, dtype)
        w_low = weight.to(dtype)
        b_low = bias.to(dtype) if bias is not None else None
        with torch.autocast(x.device.type, enabled=False):
            out = F.linear(x_low, w_low, b_low)
        ctx.save_for_backward(x_low, weight)
        ctx.x_dtype, ctx.dtype = x.dtype, dtype
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return out

    @staticmethod
    def backward(ctx, grad):
        x_low, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])
        grad_x = grad_w = grad_b = None
        # autograd's mm backward for linear(x, w) = x2 @ w.t(): grad_x2 = g @ w, and since w.t()
        # is column-major, grad_w = (g.t() @ x2) (mm_mat2_backward's transposed branch)
        if ctx.needs_input_grad[0]:
            grad_x = g2.mm(weight.to(ctx.dtype)).view(*grad.shape[:-1], weight.shape[1])
            grad_x = grad_x.to(ctx.x_dtype)
        if ctx.needs_input_grad[1]:
            grad_w = g2.t().mm(x_low.reshape(-1, x_low.shape[-1])).to(weight.dtype)
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            # addmm's bias gradient: the [N, out] gradient summed over its rows
            grad_b = g2.sum_to_size(g2.shape[-1]).to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None


class LeanLinear(nn.Linear):
    """``nn.Linear`` that, under autocast with gradients, keeps its float32 weight rather than
    autocast's bf16 copy for the backward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kind = x.device.type
        if not (torch.is_grad_enabled() and torch.is_autocast_enabled(kind)):
            return super().forward(x)
        dtype = torch.get_autocast_dtype(kind)
        if self.weight.dtype == dtype or not (x.requires_grad or self.weight.requires_grad):
            return super().forward(x)
        return _RecastLinearFn.apply(x, self.weight, self.bias, dtype)


# -- RMSNorm --------------------------------------------------------------------------------------


class _RMSNormFn(torch.autograd.Function):
    """``w * (x / rms(x))`` as Llama's RMSNorm computes it (float32 inside, the product cast
    back to the input's dtype), keeping ``x`` and ``1/rms`` instead of the normalised ``x``."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        x32 = x.to(torch.float32)
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (x32 * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        x32 = x.to(torch.float32)
        normed = (x32 * rstd).to(x.dtype)
        grad_w = (grad * normed).sum_to_size(weight.shape) if ctx.needs_input_grad[1] else None
        grad_x = None
        if ctx.needs_input_grad[0]:
            # autograd's formulas, in order: mul(w, h), h = x * r, r = rsqrt(v + eps),
            # v = mean(x^2), x^2; the two paths into x are summed as the engine sums them
            grad_h = (grad * weight).to(torch.float32)
            direct = grad_h * rstd
            grad_r = (grad_h * x32).sum_to_size(rstd.shape)
            grad_v = -0.5 * grad_r * rstd.pow(3)
            grad_sq = grad_v.expand(x32.shape) / x32.shape[-1]
            through_rms = grad_sq * (2.0 * x32.pow(1))
            grad_x = (direct + through_rms).to(x.dtype)
        return grad_x, grad_w, None


class LeanRMSNorm(nn.Module):
    """Mixin body for an RMSNorm class (``weight``, ``variance_epsilon``); see ``swap_norms``."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return super().forward(hidden_states)
        return _RMSNormFn.apply(hidden_states, self.weight, self.variance_epsilon)


# -- gated MLP ------------------------------------------------------------------------------------


class _SiluMulFn(torch.autograd.Function):
    """``silu(gate) * up``, keeping ``gate`` and ``up`` only (SiLU recomputed in the backward)."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        grad_gate = grad_up = None
        if ctx.needs_input_grad[1]:
            grad_up = grad * F.silu(gate)
        if ctx.needs_input_grad[0]:
            grad_gate = torch.ops.aten.silu_backward(grad * up, gate)
        return grad_gate, grad_up


class LeanGatedMLP(nn.Module):
    """Mixin body for a Llama-style MLP (``down(silu(gate(x)) * up(x))``); see ``swap_mlps``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return super().forward(x)
        gate, up = self.gate_proj(x), self.up_proj(x)
        if gate.dtype != up.dtype:
            return self.down_proj(self.act_fn(gate) * up)
        return self.down_proj(_SiluMulFn.apply(gate, up))


# -- installing them ------------------------------------------------------------------------------

_LEAN_CLASSES: dict[type, type] = {}


def _lean_class(cls: type, body: type) -> type:
    """``cls`` with ``body``'s forward in front of it (one class per original, made once)."""
    if cls not in _LEAN_CLASSES:
        _LEAN_CLASSES[cls] = type(f"Lean{cls.__name__}", (body, cls), {})
    return _LEAN_CLASSES[cls]


def _looks_like_rmsnorm(m: nn.Module) -> bool:
    return (
        type(m).__name__.endswith("RMSNorm")
        and isinstance(getattr(m, "weight", None), torch.Tensor)
        and m.weight.dim() == 1
        and isinstance(getattr(m, "variance_epsilon", None), float)
    )


def _looks_like_gated_mlp(m: nn.Module) -> bool:
    act = getattr(m, "act_fn", None)
    return all(
        isinstance(getattr(m, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")
    ) and isinstance(act, nn.SiLU | SiLUActivation)


@torch.no_grad()
def _probe_equal(original: nn.Module, lean_cls: type, width: int) -> bool:
    """Whether ``lean_cls``'s gradient path gives bitwise ``original``'s output on a probe."""
    x = torch.randn(2, 3, width, generator=torch.Generator().manual_seed(0)).to(
        dtype=next(original.parameters()).dtype, device=next(original.parameters()).device
    )
    expected = original(x)
    swapped = original.__class__
    original.__class__ = lean_cls
    try:
        with torch.enable_grad():
            got = original(x.requires_grad_())
    finally:
        original.__class__ = swapped
    return got.dtype == expected.dtype and torch.equal(got.detach(), expected)


def install(model: nn.Module) -> dict[str, int]:
    """Swap ``model``'s linears, RMSNorms and gated MLPs for their lean versions in place (before
    LoRA, DDP or FSDP2 wrap them). Returns how many modules of each kind were swapped."""
    counts = {"linear": 0, "rmsnorm": 0, "mlp": 0}
    verdict: dict[type, bool] = {}
    for m in model.modules():
        cls = type(m)
        if cls is nn.Linear:
            m.__class__ = LeanLinear
            counts["linear"] += 1
            continue
        if _looks_like_rmsnorm(m):
            kind, body, width = "rmsnorm", LeanRMSNorm, m.weight.shape[0]
        elif _looks_like_gated_mlp(m):
            kind, body, width = "mlp", LeanGatedMLP, m.gate_proj.in_features
        else:
            continue
        lean = _lean_class(cls, body)
        if cls not in verdict:
            verdict[cls] = _probe_equal(m, lean, width)
        if verdict[cls]:
            m.__class__ = lean
            counts[kind] += 1
    return counts
