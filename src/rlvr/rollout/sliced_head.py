"""The output layer run over slices of the vocabulary while decoding in float32 on a CPU.

A decoding step's output layer is one small-by-huge matmul: ``[rows, hidden] x [hidden, vocab]``,
e.g. ``[32, 576] x [576, 49152]`` for SmolLM2-135M. In float32 on a CPU, one call does it at a
third of the matmul peak or less, while the same product cut into 2048-row slices of the weight,
each written into its own columns of the output, runs 0.68-0.82x as long for 4 to 128 rows
(measured on an AMD EPYC, 2 threads, with and without oneDNN/MKL capped at AVX2: 27-42 ms whole
against 20-26 ms sliced for 32 rows; one row gains nothing). In bf16 (oneDNN) the whole call is
already fast (8-10 ms) and slicing does not help, so only a float32 head outside autocast is
sliced. Each output element is the same dot product over the hidden size, so the logits are the
whole call's up to the rounding of the matmul's blocking.

``sliced_head(model)`` swaps the model's output layer (``set_output_embeddings``, the models'
own setter) for the span of a decoding loop and puts the original back, so the model's forward
(and anything it does after its head) runs unchanged."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

# rows of the weight per slice: 1024-2048 were fastest on the machines measured
SLICE_ROWS = 2048


class SlicedHead(nn.Module):
    """``head(x)`` computed as one matmul per ``rows`` output features (no gradient: decoding)."""

    def __init__(self, head: nn.Linear, rows: int = SLICE_ROWS):
        super().__init__()
        self.head = head
        self.rows = rows

    # code that reads the head's parameters directly (a fused loss, a tie check) still finds them
    @property
    def weight(self) -> nn.Parameter:
        return self.head.weight

    @property
    def bias(self) -> nn.Parameter | None:
        return self.head.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.head.weight, self.head.bias
        flat = x.reshape(-1, x.shape[-1])
        out = flat.new_empty(flat.shape[0], weight.shape[0])
        for start in range(0, weight.shape[0], self.rows):
            part = slice(start, start + self.rows)
            torch.mm(flat, weight[part].t(), out=out[:, part])
        if bias is not None:
            out += bias
        return out.view(*x.shape[:-1], weight.shape[0])


def slicing_pays(head: nn.Module | None, rows: int = SLICE_ROWS) -> bool:
    """Whether ``head`` is a float32 ``nn.Linear`` on the CPU, outside autocast, with at least
    two slices of output features: the case the slices were measured to speed up."""
    if not isinstance(head, nn.Linear) or head.out_features < 2 * rows:
        return False
    w = head.weight
    # a DTensor (FSDP2) or quantised weight is not a plain float32 matrix to slice
    return (
        type(w.data) is torch.Tensor
        and w.dtype == torch.float32
        and w.device.type == "cpu"
        and not torch.is_autocast_enabled("cpu")
    )


@contextlib.contextmanager
def sliced_head(model: nn.Module, rows: int = SLICE_ROWS) -> Iterator[bool]:
    """Run ``model`` with its output layer sliced (``SlicedHead``) inside the block where that
    pays (``slicing_pays``); yields whether it did. The original layer is back afterwards, also
    when the block raises."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if not slicing_pays(head, rows):
        yield False
        return
    model.set_output_embeddings(SlicedHead(head, rows))
    try:
        yield True
    finally:
        model.set_output_embeddings(head)
