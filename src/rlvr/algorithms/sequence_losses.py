"""Sequence-level shaping and importance-sampling helpers (DAPO, truncated IS)."""

from __future__ import annotations

import torch
from torch import Tensor


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, factor: float = 1.0) -> Tensor:
    """DAPO soft overlong punishment (arXiv 2503.14476, eq. 13): 0 up to ``max_len - buffer``,
    then linear down to ``-factor`` at ``max_len``, ``-factor`` beyond. ``buffer=0``: all zeros."""
    if buffer < 0 or buffer > max_len:
        raise ValueError(f"overlong buffer must be in [0, max_len={max_len}], got {buffer}")
    lengths = lengths.to(torch.float32)
    if buffer == 0:
        return torch.zeros_like(lengths)
    over = (lengths - (max_len - buffer)).clamp(min=0.0, max=float(buffer))
    return -factor * over / buffer


@torch.no_grad()
def truncated_is_weights(trainer_logp: Tensor, engine_logp: Tensor, cap: float) -> Tensor:
    """Per token ``min(exp(trainer_logp - engine_logp), cap)``, no gradient."""
    if not cap > 0:
        raise ValueError(f"tis cap must be > 0, got {cap!r}")
    return torch.exp(trainer_logp.detach() - engine_logp.detach()).clamp(max=cap)
