"""The model's linear layers run on weights packed once for oneDNN while the hf engine decodes on a CPU.

A decoding step is a few dozen rows through every linear layer: small-by-large matmuls that
``F.linear`` (MKL in float32, oneDNN under bf16 autocast) runs at well under the CPU's matmul
peak, because every call reads the weight in its stored layout. oneDNN can reorder a weight once
into the blocked layout its kernels read (``torch.ops.mkldnn._reorder_linear_weight``, what
``torch.compile`` does for frozen CPU linears) and then run each call on it
(``torch.ops.mkldnn._linear_pointwise``). The weights change after every update, so they are
packed at the start of each rollout and dropped at its end: about 0.2 s for SmolLM2-135M's
211 linears, and one more copy of their weights held while decoding (under bf16 autocast the copy
replaces autocast's own cache of bf16 weights).

The cost is one more copy of the weights while decoding; what it saves is measured in
docs/performance.md.

Each output element is the same dot product as ``F.linear``'s: in float32 the logits agree up
to the rounding of the matmul's blocking, in bf16 they are autocast's (bf16 inputs and weights,
float32 accumulation, bf16 output). ``packed_linears(model, dtype)`` swaps every plain CPU
``nn.Linear`` (the trainer's ``LeanLinear`` and peft's base and adapter layers included) for a
``PackedLinear`` for the span of a decoding loop and puts the originals back, also when the
loop raises."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

_ops = torch.ops.mkldnn


def packable_dtype(dtype: torch.dtype) -> bool:
    """Whether oneDNN on this CPU runs packed linears in ``dtype``: float32 wherever torch was
    built with oneDNN, bf16 only where the CPU has a bf16 path (AVX512-BF16, AMX, AVX-NE-CONVERT;
    elsewhere the reorder refuses)."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and bool(_ops._is_mkldnn_bf16_supported())


class PackedLinear(nn.Module):
    """``linear(x)`` computed in ``dtype`` on a oneDNN-packed copy of its weight, for inference:
    no gradient reaches the original weight. ``rows`` is the batch size the packing is tuned for
    (any number of rows runs)."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, rows: int):
        super().__init__()
        self.linear = linear
        self.dtype = dtype
        weight = linear.weight.detach().to(dtype)
        self.packed = _ops._reorder_linear_weight(weight, max(1, rows))
        self.packed_bias = None if linear.bias is None else linear.bias.detach().to(dtype)

    # code that reads the layer's parameters (peft's adapters check lora_A.weight's dtype)
    @property
    def weight(self) -> nn.Parameter:
        return self.linear.weight

    @property
    def bias(self) -> nn.Parameter | None:
        return self.linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(self.dtype).contiguous()
        out = _ops._linear_pointwise(flat, self.packed, self.packed_bias, "none", [], "")
        return out.view(*x.shape[:-1], out.shape[-1])


def packs(module: nn.Module, dtype: torch.dtype) -> bool:
    """Whether ``module`` is a linear layer ``PackedLinear`` can stand in for: an ``nn.Linear``
    (or subclass) over a plain CPU tensor (not an FSDP2 DTensor, not quantised) of float32 or
    ``dtype``, with no hooks of its own to keep."""
    if not isinstance(module, nn.Linear):
        return False
    w = module.weight
    return (
        type(w.data) is torch.Tensor
        and w.device.type == "cpu"
        and w.dtype in (torch.float32, dtype)
        and not module._forward_hooks
        and not module._forward_pre_hooks
    )


@contextlib.contextmanager
def packed_linears(
    model: nn.Module, dtype: torch.dtype | None = None, rows: int = 32
) -> Iterator[int]:
    """Run ``model``'s linear layers as ``PackedLinear``s in ``dtype`` (None: float32; under bf16
    autocast pass bf16) inside the block; yields how many were swapped (0 where oneDNN cannot
    run ``dtype`` on this CPU). The original modules are back afterwards, also when the block
    raises."""
    dtype = dtype or torch.float32
    swapped: list[tuple[str, nn.Module]] = []
    try:
        if packable_dtype(dtype):
            with torch.no_grad():
                for name, module in list(model.named_modules()):
                    if name and packs(module, dtype):
                        model.set_submodule(name, PackedLinear(module, dtype, rows))
                        swapped.append((name, module))
        yield len(swapped)
    finally:  # also when packing itself fails part-way
        for name, module in reversed(swapped):
            model.set_submodule(name, module)
