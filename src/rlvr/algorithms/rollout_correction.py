"""Rollout correction: importance weights of the sampling engine's log-probs against the trainer's.

The engine that samples (vLLM, other kernels, bf16) and the trainer disagree slightly on
log-probs, and a stale rollout comes from older weights, so the samples are a little
off-policy. The ratio ``exp(trainer log-prob - engine log-prob)`` corrects for it, taken

- per token (``level=token``);
- per sequence (``level=sequence``): the sequence's importance ratio, the product of its token
  ratios ``exp(sum_t (trainer - engine))``, the log-ratio sum clamped to ``[-20, 20]`` before
  ``exp`` (verl's ``rollout_is="sequence"`` with its ``SAFETY_BOUND``, TRL's
  ``sequence_truncate`` / ``sequence_mask``);
- per sequence as the geometric mean of its token ratios (``level=geometric``:
  ``exp(mean_t (trainer - engine))``, verl's ``rollout_rs="geometric"``), a length-normalised
  score that stays near 1 where the product compounds a small per-token gap;

then truncated (``action=truncate``: weight ``min(ratio, cap)``, truncated importance
sampling), masked (``action=mask``: the ratio where it lies in ``[low, cap]``, 0 outside:
verl's IS weights times its rejection mask, IcePop's two-sided mask, TRL's ``token_mask`` /
``sequence_mask``, one-sided there by default: ``low=0``) or rejected (``action=reject``: 1 inside, 0 outside: a rejection
without importance weighting, verl's ``rollout_rs`` alone). The weights are constants that
multiply each token's policy-gradient term; a token with weight 0 stays in the token-mean
denominator (verl drops rejected tokens from its ``response_mask`` instead).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algorithms._checks import require_mask, require_ndim, require_same_shape
from rlvr.algorithms.sequence_losses import truncated_is_weights

LEVELS = ("token", "sequence", "geometric")
ACTIONS = ("truncate", "mask", "reject")
# verl's SAFETY_BOUND: the sequence log-ratio is clamped to [-20, 20] before exp
LOG_RATIO_BOUND = 20.0


@torch.no_grad()
def rollout_correction_weights(
    trainer_logp: Tensor,
    engine_logp: Tensor,
    mask: Tensor,
    *,
    level: str,
    action: str,
    cap: float,
    low: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``[N, T]`` weights, and where the ratio was truncated and where it was masked (bool).

    ``level``: token (one ratio per token), sequence (one per row: the product of its valid
    tokens' ratios, the log-ratio sum clamped to ``[-LOG_RATIO_BOUND, LOG_RATIO_BOUND]``) or
    geometric (one per row: the geometric mean of its valid tokens' ratios); a row's ratio
    stands on each of its valid tokens. ``action``: truncate (``min(ratio, cap)``; truncated
    where ratio > cap), mask (the ratio where ``low <= ratio <= cap``, else 0 and masked) or
    reject (1 where ``low <= ratio <= cap``, else 0 and masked); ``low`` defaults to
    ``1 / cap`` (verl's two-sided default); ``low=0`` masks above ``cap`` only (TRL's mask with
    its ``vllm_importance_sampling_clip_min`` unset). Positions outside ``mask`` get weight 0 and no flag; their log-probs may be NaN.
    """
    require_ndim("trainer_logp", trainer_logp, 2)
    require_same_shape(trainer_logp=trainer_logp, engine_logp=engine_logp, mask=mask)
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if action not in ACTIONS:
        raise ValueError(f"action must be one of {ACTIONS}, got {action!r}")
    if not cap > 0:
        raise ValueError(f"cap must be > 0, got {cap!r}")
    m = require_mask("mask", mask)
    zeros = torch.zeros_like(trainer_logp, dtype=torch.float32)
    diff = torch.where(m, trainer_logp.float() - engine_logp.float(), zeros)
    if level == "sequence":
        total = diff.sum(-1, keepdim=True).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        diff = torch.where(m, total.expand_as(diff), zeros)
    elif level == "geometric":
        n = m.sum(-1, keepdim=True).clamp(min=1)
        diff = torch.where(m, (diff.sum(-1, keepdim=True) / n).expand_as(diff), zeros)
    if action == "truncate":
        w = truncated_is_weights(diff, zeros, cap)
        truncated = m & (torch.exp(diff) > cap)
        masked = torch.zeros_like(m)
    else:
        lo = 1.0 / cap if low is None else low
        if not 0 <= lo < 1 < cap:
            raise ValueError(f"the mask range [low={lo}, cap={cap}] must contain 1")
        ratio = torch.exp(diff)
        keep = (ratio >= lo) & (ratio <= cap)
        w = torch.where(keep, ratio, zeros) if action == "mask" else keep.to(torch.float32)
        masked = m & ~keep
        truncated = torch.zeros_like(m)
    return torch.where(m, w, zeros), truncated, masked
