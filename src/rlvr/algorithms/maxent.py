"""Listwise maximum-entropy objective (MaxEnt-GRPO; docs/objectives.md and docs/DESIGN.md).

For each prompt, K sampled candidates with rewards ``r`` and reference sequence log-probs
``ref`` define a target distribution over the list:

    q   = softmax(r / q_temperature), floored: q <- q (1 - K q_eps) + q_eps
    pi* ∝ q^(1 / (tau + beta)) * pi_ref^(beta / (tau + beta))
    w   = softmax((log q + beta * ref) / (tau + beta))          (pi* restricted to the K)

and the policy is trained by weighted maximum likelihood over the list,
``-sum_i w_i log_softmax(s)_i`` with ``s`` the policy's sequence log-probs, optionally plus a
PPO-clipped term on sequence ratios (:func:`maxent_clip_term`). Groups whose rewards are all
equal carry no ranking signal and are skipped (:func:`active_groups`).

Shapes: ``[P, K]`` for per-candidate quantities (P prompts, K candidates), ``[P]`` per group.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algorithms._checks import (
    float_dtype,
    require_mask,
    require_ndim,
    require_positive,
    require_same_shape,
    require_tensor,
)
from rlvr.algorithms.kl import LOG_RATIO_CLAMP


@torch.no_grad()
def maxent_weights(
    rewards: Tensor,
    ref_seq_logp: Tensor | None,
    tau: float,
    beta: float,
    q_temperature: float,
    q_eps: float,
) -> tuple[Tensor, Tensor]:
    """Listwise target ``q`` and MaxEnt weights ``w``, both ``[P, K]``, rows summing to 1.

    Args:
        rewards: ``[P, K]`` candidate rewards (finite).
        ref_seq_logp: ``[P, K]`` reference sequence log-probs (length-normalised or not, see
            :func:`sequence_logp`); may be None when ``beta == 0`` (the term vanishes).
        tau: sequence-level entropy weight, > 0.
        beta: trust-region weight toward the reference, >= 0.
        q_temperature: softmax temperature turning rewards into ``q``, > 0.
        q_eps: floor giving every candidate mass >= q_eps; needs ``0 <= K * q_eps <= 1``.

    The weights are targets: computed without gradient.
    """
    require_ndim("rewards", rewards, 2)
    p, k = rewards.shape
    if k < 2:
        raise ValueError(f"rewards must have K >= 2 candidates per group, got shape {(p, k)}")
    require_positive("tau", tau)
    require_positive("q_temperature", q_temperature)
    if not beta >= 0:
        raise ValueError(f"beta must be >= 0, got {beta!r}")
    if not 0 <= q_eps * k <= 1:
        raise ValueError(f"q_eps must satisfy 0 <= K * q_eps <= 1 (K={k}), got {q_eps!r}")
    r = rewards.to(float_dtype(rewards))
    if not bool(torch.isfinite(r).all()):
        raise ValueError("rewards must be finite")

    q = torch.softmax(r / q_temperature, dim=-1)
    q = q * (1 - k * q_eps) + q_eps
    logits = q.log()
    if beta > 0:
        if ref_seq_logp is None:
            raise ValueError("ref_seq_logp is required when beta > 0")
        require_same_shape(rewards=rewards, ref_seq_logp=ref_seq_logp)
        if not bool(torch.isfinite(ref_seq_logp).all()):
            raise ValueError("ref_seq_logp must be finite")
        logits = logits + beta * ref_seq_logp.to(r.dtype)
    w = torch.softmax(logits / (tau + beta), dim=-1)
    return q, w


def active_groups(rewards: Tensor, tol: float = 1e-8) -> Tensor:
    """Bool ``[P]``: groups of ``rewards`` ``[P, K]`` whose max - min exceeds ``tol``."""
    require_ndim("rewards", rewards, 2)
    return (rewards.amax(-1) - rewards.amin(-1)) > tol


def _check_group_inputs(active: Tensor, **tensors: Tensor) -> Tensor:
    for name, t in tensors.items():
        require_ndim(name, t, 2)
    require_same_shape(**tensors)
    require_tensor("active", active)
    p = next(iter(tensors.values())).shape[0]
    if active.shape != (p,):
        raise ValueError(f"active must have shape [{p}], got {tuple(active.shape)}")
    return require_mask("active", active)


def maxent_listwise_loss(policy_seq_logp: Tensor, weights: Tensor, active: Tensor) -> Tensor:
    """Weighted listwise cross-entropy ``-sum_i w_i log_softmax(s)_i``, mean over active groups.

    Args:
        policy_seq_logp: ``[P, K]`` policy sequence log-probs ``s`` (carry gradient).
        weights: ``[P, K]`` from :func:`maxent_weights` (constants).
        active: bool ``[P]`` from :func:`active_groups`.

    Returns a scalar; with no active group it is 0 with a zero gradient (never NaN). Inactive
    groups are dropped before the softmax, so non-finite values there cannot leak in.
    """
    act = _check_group_inputs(active, policy_seq_logp=policy_seq_logp, weights=weights)
    s = policy_seq_logp[act]  # [A, K]
    if s.shape[0] == 0:
        # The sum of an empty selection: exactly 0, still attached to the graph, zero gradient.
        return s.sum()
    w = weights[act].detach().to(s.dtype)
    per_group = -(w * torch.log_softmax(s, dim=-1)).sum(-1)
    return per_group.mean()


def maxent_clip_term(
    policy_seq_logp: Tensor,
    old_seq_logp: Tensor,
    weights: Tensor,
    active: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    log_ratio_clamp: float = LOG_RATIO_CLAMP,
) -> Tensor:
    """PPO-clipped sequence-level term with listwise advantages ``a_i = w_i - 1/K``.

    Per candidate, ``ratio_i = exp(clamp(s_i - s_old_i, -c, c))`` (``c = log_ratio_clamp``) and the loss is
    ``-min(ratio_i a_i, clip(ratio_i, 1 - clip_low, 1 + clip_high) a_i)``, summed over the K
    candidates of a group and averaged over active groups. Summing (not averaging) over the
    candidates gives, at ratio 1 and a uniform policy, the same gradient as
    :func:`maxent_listwise_loss` (``-(w_i - 1/K)`` per candidate), so a coefficient of 1 puts the
    two terms on one scale.

    Args:
        policy_seq_logp: ``[P, K]`` current sequence log-probs (carry gradient).
        old_seq_logp: ``[P, K]`` sequence log-probs at sampling time (constants).
        weights: ``[P, K]`` MaxEnt weights (constants). active: bool ``[P]``.
        clip_low, clip_high: clip range of the ratio.

    Returns a scalar; 0 with zero gradient if no group is active.
    """
    act = _check_group_inputs(
        active, policy_seq_logp=policy_seq_logp, old_seq_logp=old_seq_logp, weights=weights
    )
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low!r}")
    if not clip_high >= 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high!r}")
    s = policy_seq_logp[act]
    if s.shape[0] == 0:
        # The sum of an empty selection: exactly 0, still attached to the graph, zero gradient.
        return s.sum()
    k = s.shape[1]
    adv = weights[act].detach().to(s.dtype) - 1.0 / k
    log_ratio = (s - old_seq_logp[act].detach()).clamp(-log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv)
    return -surrogate.sum(-1).mean()


def sequence_logp(token_logp: Tensor, mask: Tensor, length_normalize: bool) -> Tensor:
    """Sequence log-probs ``[N]`` from token log-probs ``[N, T]`` over the 0/1 ``mask``.

    ``length_normalize=True`` gives the per-token mean (an empty row gives 0), else the sum.
    Gradient flows through ``token_logp``; masked positions (even NaN/inf) are ignored.
    """
    require_ndim("token_logp", token_logp, 2)
    require_same_shape(token_logp=token_logp, mask=mask)
    m = require_mask("mask", mask)
    total = torch.where(m, token_logp, torch.zeros_like(token_logp)).sum(-1)
    if not length_normalize:
        return total
    return total / m.sum(-1).clamp(min=1).to(total.dtype)
