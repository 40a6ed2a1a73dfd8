"""Sequence-level shaping, importance sampling and the GSPO / GSPO-token / CISPO losses.

Token tensors are ``[N, T]`` with a 0/1 ``mask``; masked positions never reach a value or a
gradient (padding log-probs may be NaN). ``denominator`` replaces a loss's own count so that a
minibatch cut into micro-batches gives the sum of the micro-batch losses (see `losses`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algorithms._checks import (
    require_mask,
    require_ndim,
    require_positive,
    require_same_shape,
    require_tensor,
)


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


def _check_inputs(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    denominator: float | None,
    *,
    allow_low_one: bool,
) -> Tensor:
    """Shapes and ranges shared by the two losses; returns the mask as bool."""
    require_ndim("logp", logp, 2)
    require_same_shape(logp=logp, old_logp=old_logp, mask=mask)
    require_tensor("advantages", advantages)
    if advantages.shape != logp.shape[:1]:
        raise ValueError(
            f"advantages must be [N]={tuple(logp.shape[:1])} (one per sequence), "
            f"got {tuple(advantages.shape)}"
        )
    if not (0.0 <= clip_low < 1.0 or (allow_low_one and clip_low == 1.0)):
        hi = "1]" if allow_low_one else "1)"
        raise ValueError(f"clip_low must be in [0, {hi}, got {clip_low!r}")
    if not clip_high >= 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high!r}")
    if denominator is not None:
        require_positive("denominator", float(denominator))
    return require_mask("mask", mask)


def gspo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    *,
    denominator: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO (arXiv 2507.18071, eq. 5-7): s_i = exp(mean_t (logp - old_logp)) over sequence i's
    valid tokens; loss = -sum_i min(s_i A_i, clip(s_i, 1 - clip_low, 1 + clip_high) A_i) / D.

    D is the number of sequences with a valid token (``denominator`` replaces it); rows with no
    valid token add nothing. ``advantages`` ``[N]``, one per sequence, are constants.
    Stats: ``seq_ratio_mean/min/max`` and ``seq_clip_frac`` (share of sequences whose ratio lies
    outside the clip range) over the non-empty sequences.
    """
    m = _check_inputs(
        logp, old_logp, advantages, mask, clip_low, clip_high, denominator, allow_low_one=False
    )
    zeros = torch.zeros_like(logp)
    lr = torch.where(m, logp - old_logp.detach(), zeros)
    n_tok = m.sum(-1)
    rows = n_tok > 0
    s = torch.exp(lr.sum(-1) / n_tok.clamp(min=1).to(logp.dtype))
    adv = torch.where(rows, advantages.detach().to(logp.dtype), torch.zeros_like(s))
    clipped = s.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_seq = -torch.minimum(s * adv, clipped * adv)
    d = denominator if denominator is not None else rows.sum().clamp(min=1).to(logp.dtype)
    loss = per_seq.sum() / d
    with torch.no_grad():
        sd = s[rows]
        if sd.numel() == 0:
            sd = s.new_ones(1)
        out = (sd < 1.0 - clip_low) | (sd > 1.0 + clip_high)
        values = torch.stack([sd.mean(), sd.min(), sd.max(), out.to(sd.dtype).mean()]).tolist()
    keys = ("seq_ratio_mean", "seq_ratio_min", "seq_ratio_max", "seq_clip_frac")
    return loss, dict(zip(keys, values, strict=True))


def gspo_token_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    *,
    denominator: float | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO-token (arXiv 2507.18071, section 4.3, eq. 13-14): token advantages with the sequence
    ratio. Per token ``s_it = sg[s_i] * pi(y_it) / sg[pi(y_it)]``: its value is the sequence ratio
    ``s_i = exp(mean_t (logp - old_logp))``, its gradient ``s_i * grad log pi(y_it)``;
    loss = -sum_i (1/|y_i|) sum_t min(s_it A_it, clip(s_it, 1 - clip_low, 1 + clip_high) A_it) / D.

    D is the number of sequences with a valid token (``denominator`` replaces it). With every
    token of a sequence given its sequence's advantage, value and gradient equal `gspo_loss`'s.
    ``advantages`` ``[N]`` or ``[N, T]`` constants; ``is_weights`` optional ``[N, T]`` constants
    multiplying each token's term (rollout correction). Stats as `gspo_loss`.
    """
    m, adv = _token_advantages(
        logp, old_logp, advantages, mask, clip_low, clip_high, denominator, allow_low_one=False
    )
    zeros = torch.zeros_like(logp)
    lp = torch.where(m, logp, zeros)
    n_tok = m.sum(-1)
    rows = n_tok > 0
    log_s = torch.where(m, logp - old_logp.detach(), zeros).sum(-1) / n_tok.clamp(min=1)
    # value s_i on every token, gradient through the token's own log-prob only
    s_tok = torch.exp(log_s.detach()[:, None] + lp - lp.detach())
    a = torch.where(m, adv.detach().to(logp.dtype), zeros)
    clipped = s_tok.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_tok = -torch.minimum(s_tok * a, clipped * a)
    if is_weights is not None:
        require_same_shape(logp=logp, is_weights=is_weights)
        per_tok = per_tok * torch.where(m, is_weights.detach().to(logp.dtype), zeros)
    per_tok = torch.where(m, per_tok, zeros)
    per_seq = per_tok.sum(-1) / n_tok.clamp(min=1).to(logp.dtype)
    d = denominator if denominator is not None else rows.sum().clamp(min=1).to(logp.dtype)
    loss = per_seq.sum() / d
    with torch.no_grad():
        sd = torch.exp(log_s)[rows]
        if sd.numel() == 0:
            sd = logp.new_ones(1)
        out = (sd < 1.0 - clip_low) | (sd > 1.0 + clip_high)
        values = torch.stack([sd.mean(), sd.min(), sd.max(), out.to(sd.dtype).mean()]).tolist()
    keys = ("seq_ratio_mean", "seq_ratio_min", "seq_ratio_max", "seq_clip_frac")
    return loss, dict(zip(keys, values, strict=True))


def cispo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    *,
    denominator: float | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585, eq. 4-5): per token
    ``-stopgrad(clip(r_t, 1 - clip_low, 1 + clip_high)) * A * logp_t``, summed over the valid
    tokens and divided by their number D (a token mean over the batch; ``denominator`` replaces
    D). Every token keeps a gradient: the clip bounds the weight, it never drops the token.
    ``clip_low=1`` leaves the weight without a lower bound (the paper's setting).

    ``advantages`` ``[N]`` or ``[N, T]``; ``is_weights`` optional ``[N, T]`` constants that
    multiply each token's term (truncated importance sampling). Stats: ``cispo_weight_mean/min/max``
    of the clipped weights and ``cispo_clip_frac`` (share of tokens whose ratio was clipped).
    """
    m, adv = _token_advantages(
        logp, old_logp, advantages, mask, clip_low, clip_high, denominator, allow_low_one=True
    )
    zeros = torch.zeros_like(logp)
    lp = torch.where(m, logp, zeros)
    with torch.no_grad():
        ratio = torch.exp(torch.where(m, logp.detach() - old_logp.detach(), zeros))
        w = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
        if is_weights is not None:
            require_same_shape(logp=logp, is_weights=is_weights)
            w = w * torch.where(m, is_weights.detach().to(w.dtype), zeros)
        coef = torch.where(m, w * adv.detach().to(w.dtype), zeros)
    d = denominator if denominator is not None else m.sum().clamp(min=1).to(logp.dtype)
    loss = -(coef * lp).sum() / d
    with torch.no_grad():
        sel = ratio[m]
        ws = w[m] if sel.numel() else ratio.new_ones(1)
        hit = (sel < 1.0 - clip_low) | (sel > 1.0 + clip_high)
        frac = hit.to(ratio.dtype).mean() if sel.numel() else ratio.new_zeros(())
        values = torch.stack([ws.mean(), ws.min(), ws.max(), frac]).tolist()
    keys = ("cispo_weight_mean", "cispo_weight_min", "cispo_weight_max", "cispo_clip_frac")
    return loss, dict(zip(keys, values, strict=True))


def _token_advantages(
    logp, old_logp, advantages, mask, clip_low, clip_high, denominator, *, allow_low_one: bool
) -> tuple[Tensor, Tensor]:
    """The checked mask and ``[N, T]`` advantages of a token-level loss: ``advantages`` given
    per token (``[N, T]``) or per sequence (``[N]``, spread over its tokens)."""
    require_tensor("advantages", advantages)
    adv_flat = advantages if advantages.dim() != 2 else advantages[:, 0]
    m = _check_inputs(
        logp,
        old_logp,
        adv_flat,
        mask,
        clip_low,
        clip_high,
        denominator,
        allow_low_one=allow_low_one,
    )
    if advantages.dim() == 2:
        require_same_shape(logp=logp, advantages=advantages)
        return m, advantages
    return m, advantages[:, None].expand_as(logp)
