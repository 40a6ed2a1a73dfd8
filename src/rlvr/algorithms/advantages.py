"""Advantage estimators: group-relative (GRPO, Dr.GRPO, RLOO) and GAE for PPO with a critic.

Shapes: P prompts, G samples per prompt, N = P * G sequences in group-major order (rows
``0..G-1`` are prompt 0's group), T token positions. Advantages are constants for the policy
update, so every function here returns a tensor without gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rlvr.algorithms._checks import (
    float_dtype,
    require_in_unit,
    require_mask,
    require_ndim,
    require_same_shape,
    require_tensor,
)

GROUP_METHODS: tuple[str, ...] = ("grpo", "drgrpo", "rloo")


def as_groups(x: Tensor, group_size: int, name: str) -> Tensor:
    """View ``x`` (``[P, G]`` or flat ``[P * G]``) as ``[P, G]``; fail with ``name`` if it can't."""
    require_tensor(name, x)
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if x.dim() == 2:
        if x.shape[1] != group_size:
            raise ValueError(
                f"{name} has shape {tuple(x.shape)} but group_size={group_size}; "
                f"expected [P, {group_size}]"
            )
        return x
    if x.dim() == 1:
        if x.numel() % group_size != 0:
            raise ValueError(
                f"{name} has {x.numel()} elements, not a multiple of group_size={group_size}"
            )
        return x.reshape(-1, group_size)
    raise ValueError(f"{name} must be [P, G] or flat [P*G], got shape {tuple(x.shape)}")


@torch.no_grad()
def group_advantages(
    rewards: Tensor,
    group_size: int,
    method: str = "grpo",
    *,
    valid: Tensor | None = None,
    eps: float = 1e-6,
) -> Tensor:
    """Group-relative advantages of sequence rewards.

    Args:
        rewards: ``[P, G]`` or flat ``[P * G]`` (group-major); int/bool rewards become float.
        group_size: G, samples per prompt.
        method: ``grpo`` -- ``(r - mean) / (std + eps)`` with the *unbiased* group std
            (Bessel's correction, n - 1 in the denominator; TRL, verl and OAT all use
            ``torch.std``, which is unbiased); ``drgrpo`` -- ``r - mean`` (Dr.GRPO drops the std
            division); ``rloo`` -- ``r_i - mean_{j != i} r_j``, the leave-one-out baseline.
        valid: optional bool mask shaped like ``rewards``; invalid samples (for example a reward
            function that failed) are left out of their group's mean/std and get advantage
            exactly 0. Their reward value is ignored, so it may be NaN.
        eps: added to the std for ``grpo``.

    Returns:
        Advantages with the shape of ``rewards``. A group with fewer than two valid samples
        (no baseline can be formed) or whose valid rewards are all equal gets all zeros.
    """
    if method not in GROUP_METHODS:
        raise ValueError(f"unknown group advantage method {method!r}; known: {GROUP_METHODS}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    r = as_groups(rewards, group_size, "rewards").to(float_dtype(rewards))
    if valid is None:
        v = torch.ones_like(r, dtype=torch.bool)
    else:
        require_tensor("valid", valid)
        if valid.dtype != torch.bool:
            raise ValueError(f"valid must be a bool tensor, got dtype {valid.dtype}")
        require_same_shape(rewards=rewards, valid=valid)
        v = valid.reshape(r.shape)
    bad = v & ~torch.isfinite(r)
    if bool(bad.any()):
        where = bad.reshape(-1).nonzero().flatten().tolist()[:8]
        raise ValueError(
            f"rewards has non-finite values at valid flat positions {where}; "
            "mark failed rewards with valid=False"
        )

    vf = v.to(r.dtype)
    r = torch.where(v, r, torch.zeros_like(r))  # drop NaNs of invalid samples before summing
    n = vf.sum(-1, keepdim=True)  # [P, 1] valid samples per group
    mean = r.sum(-1, keepdim=True) / n.clamp(min=1)
    centred = (r - mean) * vf
    if method == "drgrpo":
        adv = centred
    elif method == "grpo":
        var = centred.pow(2).sum(-1, keepdim=True) / (n - 1).clamp(min=1)
        adv = centred / (var.sqrt() + eps)
    else:  # rloo: r_i - (S - r_i) / (n - 1) = n / (n - 1) * (r_i - S / n)
        adv = centred * n / (n - 1).clamp(min=1)
    # Constant groups are zeroed explicitly: a rounded mean leaves ~1e-17 residues that the std
    # division would blow up (0.1 * 3 / 3 != 0.1 in floating point).
    inf = torch.full_like(r, float("inf"))
    spread = torch.where(v, r, -inf).amax(-1, keepdim=True) - torch.where(v, r, inf).amin(
        -1, keepdim=True
    )
    keep = (n >= 2) & (spread > 0)
    adv = torch.where(keep, adv, torch.zeros_like(adv))
    return adv.reshape(rewards.shape)


@torch.no_grad()
def gae_advantages(
    token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over response tokens.

    Args:
        token_rewards: ``[N, T]``, usually the sequence reward on the last valid token (see
            :func:`last_token_rewards`) plus any per-token KL penalty.
        values: ``[N, T]`` critic values V(s_t) for the state before each response token.
        mask: ``[N, T]`` 0/1; masked positions are skipped: the recursion carries the next
            valid token's value and advantage across them, so a gap in the mask (or right
            padding) behaves as if those positions were absent. The value after the last valid
            token is 0 (the episode ends there).
        gamma: discount in [0, 1]. lam: GAE lambda in [0, 1].

    Returns:
        ``(advantages, returns)``, both ``[N, T]`` and 0 at masked positions;
        ``returns = advantages + values`` (the critic's regression target, before any whitening).
    """
    require_ndim("token_rewards", token_rewards, 2)
    require_same_shape(token_rewards=token_rewards, values=values, mask=mask)
    require_in_unit("gamma", gamma)
    require_in_unit("lam", lam)
    m = require_mask("mask", mask).to(values.dtype)
    r = torch.where(m.bool(), token_rewards.to(values.dtype), torch.zeros_like(values))
    v = torch.where(m.bool(), values, torch.zeros_like(values))

    n, t_len = v.shape
    advantages = torch.zeros_like(v)
    next_value = v.new_zeros(n)
    last_gae = v.new_zeros(n)
    # A loop over time is inherent to the recursion; it is vectorised over the N sequences.
    for t in reversed(range(t_len)):
        mt = m[:, t]
        delta = r[:, t] + gamma * next_value - v[:, t]
        gae_t = delta + gamma * lam * last_gae
        next_value = mt * v[:, t] + (1 - mt) * next_value
        last_gae = mt * gae_t + (1 - mt) * last_gae
        advantages[:, t] = last_gae
    advantages = advantages * m
    returns = (advantages + v) * m
    return advantages, returns


@torch.no_grad()
def whiten(
    values: Tensor,
    mask: Tensor,
    shift_mean: bool = True,
    eps: float = 1e-8,
    total: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """Normalise ``values`` ``[N, T]`` to zero mean and unit variance over the masked tokens.

    Uses the population (biased) variance over all masked tokens of the batch. With
    ``shift_mean=False`` the mean is added back (only the scale changes), as PPO implementations
    do for rewards. Returns ``[N, T]`` with 0 at masked positions. ``total`` sums a tensor over
    the parts of a batch split across processes, so the mean and variance are the whole batch's
    (two passes, as in one process); None: this is the whole batch.
    """
    require_same_shape(values=values, mask=mask)
    m = require_mask("mask", mask)
    mf = m.to(values.dtype)
    total = total or (lambda t: t)
    x = torch.where(m, values, torch.zeros_like(values))
    count, sum_x = total(torch.stack([mf.sum(), x.sum()]))
    count = count.clamp(min=1)
    mean = sum_x / count
    var = total(((x - mean) * mf).pow(2).sum()) / count
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mf


@torch.no_grad()
def last_token_rewards(seq_rewards: Tensor, mask: Tensor) -> Tensor:
    """Place each sequence's reward ``[N]`` on its last valid token of ``mask`` ``[N, T]``.

    Returns ``[N, T]``, zero elsewhere; a row with no valid token gets no reward at all.
    """
    require_ndim("seq_rewards", seq_rewards, 1)
    require_ndim("mask", mask, 2)
    if seq_rewards.shape[0] != mask.shape[0]:
        raise ValueError(
            f"seq_rewards has {seq_rewards.shape[0]} rows but mask has {mask.shape[0]}"
        )
    m = require_mask("mask", mask)
    positions = torch.arange(1, m.shape[1] + 1, device=m.device)
    last = (m * positions).argmax(-1)  # index of the last 1 (0 for an empty row)
    dtype = float_dtype(seq_rewards)
    out = torch.zeros(m.shape, dtype=dtype, device=m.device)
    out.scatter_(1, last[:, None], seq_rewards.to(dtype)[:, None])
    return out * m.to(dtype)
