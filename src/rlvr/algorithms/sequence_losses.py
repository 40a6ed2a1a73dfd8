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


def gspo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO (arXiv 2507.18071): s_i = exp(mean_t (logp - old_logp)) over sequence i's valid
    tokens; loss = -mean_i min(s_i A_i, clip(s_i, 1 - clip_low, 1 + clip_high) A_i)."""
    m = mask.bool()
    zeros = torch.zeros_like(logp)
    lr = torch.where(m, logp - old_logp.detach(), zeros)
    n_tok = m.sum(-1).clamp(min=1).to(logp.dtype)
    s = torch.exp(lr.sum(-1) / n_tok)
    adv = advantages.detach().to(logp.dtype)
    clipped = s.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = -torch.minimum(s * adv, clipped * adv).mean()
    sd = s.detach()
    stats = {
        "seq_ratio_mean": float(sd.mean()),
        "seq_ratio_min": float(sd.min()),
        "seq_ratio_max": float(sd.max()),
        "seq_clip_frac": float(((sd != clipped.detach()).float()).mean()),
    }
    return loss, stats
