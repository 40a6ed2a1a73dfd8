"""Token-level losses: aggregation modes, the clipped policy loss and the clipped value loss.

Token tensors are ``[N, T]`` (N sequences, T positions) with a 0/1 ``mask``; masked positions
never influence a loss or its gradient, even if they hold NaN or inf (padding log-probs).

Micro-batching: a loss over a minibatch split into micro-batches equals the sum of the
micro-batch losses when every micro-batch is aggregated with ``denominator`` set to the whole
minibatch's count (:func:`aggregate_denominator` of the minibatch mask).
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
from rlvr.algorithms.kl import LOG_RATIO_CLAMP

AGG_MODES: tuple[str, ...] = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def _check_mode(mode: str) -> None:
    if mode not in AGG_MODES:
        raise ValueError(f"unknown agg_mode {mode!r}; known: {AGG_MODES}")


def aggregate_denominator(mask: Tensor, mode: str) -> float:
    """The count that :func:`aggregate` divides by for ``mask`` ``[N, T]`` in ``mode``.

    ``token_mean``: the number of valid tokens. The two ``seq_*`` modes: the number of
    sequences with at least one valid token (all-padding rows do not dilute the mean).
    Compute it on a whole minibatch and pass it as ``denominator`` for each micro-batch.
    """
    _check_mode(mode)
    require_ndim("mask", mask, 2)
    m = require_mask("mask", mask)
    if mode == "token_mean":
        return float(m.sum())
    return float(m.any(-1).sum())


def aggregate(
    values: Tensor,
    mask: Tensor,
    mode: str,
    max_len: int | None = None,
    denominator: float | None = None,
) -> Tensor:
    """Reduce per-token ``values`` ``[N, T]`` to a scalar over the tokens where ``mask`` is 1.

    Modes:
        ``token_mean``: ``sum(values * mask) / D``, D = number of valid tokens.
        ``seq_mean_token_mean``: ``sum_i (sum_t values_it mask_it / len_i) / D``, the mean over
        sequences of each sequence's token mean; D = number of non-empty sequences.
        ``seq_mean_token_sum_norm`` (Dr.GRPO): ``sum_i (sum_t values_it mask_it / max_len) / D``;
        every sequence's token sum is divided by the same constant ``max_len`` (the generation
        budget), so long and short answers weigh the same per token. ``max_len`` is required.

    ``denominator`` replaces D (see the module docstring on micro-batches). With no valid
    token and no ``denominator`` the result is 0 with a zero gradient.
    """
    _check_mode(mode)
    require_ndim("values", values, 2)
    require_same_shape(values=values, mask=mask)
    m = require_mask("mask", mask)
    if denominator is not None:
        require_positive("denominator", float(denominator))
    # where() (not multiplication) so NaN/inf at masked positions reach neither value nor grad.
    x = torch.where(m, values, torch.zeros_like(values))

    if mode == "token_mean":
        total = x.sum()
        default = m.sum()
    elif mode == "seq_mean_token_mean":
        lengths = m.sum(-1)
        total = (x.sum(-1) / lengths.clamp(min=1)).sum()
        default = (lengths > 0).sum()
    else:
        if max_len is None:
            raise ValueError(
                "max_len is required for agg_mode 'seq_mean_token_sum_norm' "
                "(Dr.GRPO divides each sequence's token sum by the constant generation budget)"
            )
        require_positive("max_len", max_len)
        longest = int(m.sum(-1).max()) if m.numel() else 0
        if longest > max_len:
            raise ValueError(f"max_len={max_len} but a sequence has {longest} valid tokens")
        total = (x.sum(-1) / max_len).sum()
        default = m.any(-1).sum()

    if denominator is None:
        return total / default.clamp(min=1).to(total.dtype)
    return total / denominator


def _quantile(x: Tensor, q: float) -> Tensor:
    """Quantile ``q`` of a non-empty 1-D ``x`` with linear interpolation (as ``torch.quantile``,
    which refuses inputs above 2**24 elements; a long-context batch can have more tokens)."""
    xs = x.sort().values
    pos = q * (xs.numel() - 1)
    lo = int(pos)
    hi = min(lo + 1, xs.numel() - 1)
    return xs[lo] + (pos - lo) * (xs[hi] - xs[lo])


def _masked_stats(x: Tensor, m: Tensor) -> Tensor:
    """``[mean, min, max]`` of ``x`` over ``m`` (zeros if ``m`` is empty)."""
    sel = x[m]
    if sel.numel() == 0:
        return x.new_zeros(3)
    return torch.stack([sel.mean(), sel.min(), sel.max()])


def _masked_log_ratio(
    logp: Tensor, old_logp: Tensor, adv: Tensor, m: Tensor
) -> tuple[Tensor, Tensor]:
    """``logp - old_logp`` and the advantages with masked positions set to 0 (all ``[N, T]``).

    Masked positions are replaced before any arithmetic so that a NaN/inf log-prob in padding
    cannot leak into the gradient through exp() (0 * exp(nan) is nan in backward).
    """
    zeros = torch.zeros_like(logp)
    raw_log_ratio = torch.where(m, logp - old_logp.detach(), zeros)
    return raw_log_ratio, torch.where(m, adv.detach().to(logp.dtype), zeros)


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    log_ratio_clamp: float = LOG_RATIO_CLAMP,
    agg_mode: str = "seq_mean_token_sum_norm",
    max_len: int | None = None,
    denominator: float | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate loss with asymmetric clipping, optional dual clip and IS weights.

    Per token, with ``ratio = exp(clamp(logp - old_logp, -log_ratio_clamp, log_ratio_clamp))``:
    ``loss_t = max(-A ratio, -A clip(ratio, 1 - clip_low, 1 + clip_high))``; with ``dual_clip``
    c > 1, tokens with A < 0 use ``min(loss_t, -A c)`` (Ye et al. 2020), bounding the loss when
    the ratio explodes on a negative-advantage token. ``is_weights`` multiply ``loss_t`` as
    constants (a truncated importance-sampling correction for sampler/learner mismatch).
    The clamp only guards against overflow; a clamped token gets no gradient through the ratio.

    Args:
        logp: ``[N, T]`` current policy log-probs of the sampled tokens (carries gradient).
        old_logp: ``[N, T]`` log-probs at sampling time (treated as constants).
        advantages: ``[N]`` (one per sequence, broadcast over tokens) or ``[N, T]``; constants.
        mask: ``[N, T]`` 0/1 response-token mask.
        clip_low, clip_high: the ratio is clipped to ``[1 - clip_low, 1 + clip_high]``
            (clip-higher: a larger ``clip_high`` lets rare tokens grow faster).
        dual_clip: None, or the dual-clip constant c > 1.
        log_ratio_clamp: bound on |log-ratio| before the exponential.
        agg_mode, max_len, denominator: passed to :func:`aggregate`.
        is_weights: optional ``[N, T]`` non-negative weights, no gradient through them.

    Returns:
        ``(loss, stats)``; ``stats`` holds python floats over the valid tokens:
        ``ratio_mean/min/max`` (clamped ratio, as used in the loss); ``clip_frac_low`` (A < 0 and
        ratio < 1 - clip_low: the low clip binds, no gradient), ``clip_frac_high`` (A > 0 and
        ratio > 1 + clip_high); ``dual_clip_frac`` (A < 0 and ratio > c); ``approx_kl``, the k3
        estimate ``ratio - 1 - log ratio`` of KL(old || new) under the old policy's samples;
        ``log_ratio_max/min`` and ``log_ratio_abs_p99`` of the raw, unclamped log-ratio;
        ``log_ratio_clamped_max`` (max of the clamped one); ``tokens``.
    """
    require_ndim("logp", logp, 2)
    require_same_shape(logp=logp, old_logp=old_logp, mask=mask)
    require_tensor("advantages", advantages)
    if advantages.shape == logp.shape[:1]:
        adv = advantages[:, None].expand_as(logp)
    elif advantages.shape == logp.shape:
        adv = advantages
    else:
        raise ValueError(
            f"advantages must be [N]={tuple(logp.shape[:1])} or [N, T]={tuple(logp.shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low!r}")
    if not clip_high >= 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high!r}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be None or > 1, got {dual_clip!r}")
    require_positive("log_ratio_clamp", log_ratio_clamp)
    m = require_mask("mask", mask)

    raw_log_ratio, adv = _masked_log_ratio(logp, old_logp, adv, m)
    log_ratio = raw_log_ratio.clamp(-log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)

    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(loss_unclipped, loss_clipped)
    if dual_clip is not None:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * dual_clip), per_token)
    if is_weights is not None:
        require_same_shape(logp=logp, is_weights=is_weights)
        per_token = per_token * torch.where(
            m, is_weights.detach().to(logp.dtype), torch.zeros_like(logp)
        )
    loss = aggregate(per_token, mask, agg_mode, max_len=max_len, denominator=denominator)
    stats = _ratio_stats(
        raw_log_ratio.detach(), log_ratio.detach(), adv, m, clip_low, clip_high, dual_clip
    )
    return loss, stats


@torch.no_grad()
def _ratio_stats(
    raw_log_ratio: Tensor,
    log_ratio: Tensor,
    adv: Tensor,
    m: Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
) -> dict[str, float]:
    """Diagnostics of :func:`policy_loss` over the valid tokens ``m`` (all inputs ``[N, T]``)."""
    ratio = log_ratio.exp()
    mf = m.to(ratio.dtype)
    n_tok = mf.sum()
    denom = n_tok.clamp(min=1)

    def frac(hit: Tensor) -> Tensor:
        return (hit & m).to(ratio.dtype).sum() / denom

    dual_hit = (adv < 0) & (ratio > dual_clip) if dual_clip is not None else torch.zeros_like(m)
    abs_raw = raw_log_ratio.abs()[m]
    ratio_mean, ratio_min, ratio_max = _masked_stats(ratio, m)
    _, raw_min, raw_max = _masked_stats(raw_log_ratio, m)
    stats = {
        "ratio_mean": ratio_mean,
        "ratio_min": ratio_min,
        "ratio_max": ratio_max,
        "clip_frac_low": frac((adv < 0) & (ratio < 1.0 - clip_low)),
        "clip_frac_high": frac((adv > 0) & (ratio > 1.0 + clip_high)),
        "dual_clip_frac": frac(dual_hit),
        "approx_kl": ((ratio - 1.0 - log_ratio) * mf).sum() / denom,
        "log_ratio_max": raw_max,
        "log_ratio_min": raw_min,
        "log_ratio_abs_p99": _quantile(abs_raw, 0.99) if abs_raw.numel() else n_tok * 0,
        "log_ratio_clamped_max": _masked_stats(log_ratio, m)[2],
        "tokens": n_tok,
    }
    values = torch.stack([v.to(ratio.dtype) for v in stats.values()]).tolist()  # one sync
    return dict(zip(stats, values, strict=True))


def ratio_stats(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    log_ratio_clamp: float = LOG_RATIO_CLAMP,
) -> dict[str, float]:
    """The ratio diagnostics of :func:`policy_loss` for any objective that has token log-ratios
    (e.g. the listwise objective, whose loss is not a per-token surrogate). Shapes as there."""
    m = require_mask("mask", mask)
    adv = advantages.unsqueeze(-1).expand_as(logp) if advantages.dim() == 1 else advantages
    raw, adv = _masked_log_ratio(logp.detach(), old_logp, adv, m)
    clamped = raw.clamp(-log_ratio_clamp, log_ratio_clamp)
    return _ratio_stats(raw, clamped, adv, m, clip_low, clip_high, dual_clip)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None = 0.2,
    agg_mode: str = "token_mean",
    max_len: int | None = None,
    denominator: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped critic loss ``0.5 * max((V - R)^2, (V_clip - R)^2)`` per token, aggregated.

    ``V_clip = V_old + clamp(V - V_old, -clip, clip)`` keeps the critic near the values it had
    when the batch was collected; ``clip=None`` gives the plain ``0.5 (V - R)^2``.

    Args:
        values: ``[N, T]`` current critic values (carry gradient).
        old_values: ``[N, T]`` values at collection time (constants).
        returns: ``[N, T]`` regression targets, e.g. from :func:`gae_advantages` (constants).
        mask: ``[N, T]`` 0/1.
        agg_mode, max_len, denominator: passed to :func:`aggregate` (default ``token_mean``).

    Returns:
        ``(loss, stats)`` with ``value_clip_frac`` (fraction of valid tokens where the clipped
        error is the larger one, so the token gives no gradient), ``value_mean``, ``return_mean``.
    """
    require_ndim("values", values, 2)
    require_same_shape(values=values, old_values=old_values, returns=returns, mask=mask)
    if clip is not None:
        require_positive("clip", clip)
    m = require_mask("mask", mask)
    zeros = torch.zeros_like(values)
    v = torch.where(m, values, zeros)
    v_old = torch.where(m, old_values.detach(), zeros)
    ret = torch.where(m, returns.detach(), zeros)

    err = (v - ret).pow(2)
    if clip is None:
        per_token = 0.5 * err
        clipped_hit = torch.zeros_like(m)
    else:
        v_clipped = v_old + (v - v_old).clamp(-clip, clip)
        err_clipped = (v_clipped - ret).pow(2)
        per_token = 0.5 * torch.maximum(err, err_clipped)
        clipped_hit = err_clipped.detach() > err.detach()
    loss = aggregate(per_token, mask, agg_mode, max_len=max_len, denominator=denominator)

    with torch.no_grad():
        mf = m.to(values.dtype)
        denom = mf.sum().clamp(min=1)
        stats = torch.stack(
            [(clipped_hit & m).to(mf.dtype).sum() / denom, v.sum() / denom, ret.sum() / denom]
        ).tolist()
    return loss, dict(zip(("value_clip_frac", "value_mean", "return_mean"), stats, strict=True))
