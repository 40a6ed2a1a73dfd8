"""The loss of one micro-batch for each objective: glue between the trainer and `rlvr.algorithms`.

Every loss here is written so that summing the micro-batch losses of a minibatch gives exactly the
minibatch loss: the trainer passes the minibatch's own counts (``MinibatchCounts``) as denominators.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.algorithms import (
    aggregate,
    kl_estimate,
    maxent_clip_term,
    maxent_listwise_loss,
    policy_loss,
    ratio_stats,
    sequence_logp,
    value_loss,
)
from rlvr.config import Config


@dataclass
class MinibatchCounts:
    """Denominators of a whole minibatch (valid rows only)."""

    sequences: int
    tokens: int
    active_groups: int

    def for_mode(self, mode: str) -> int:
        return max(1, self.tokens if mode == "token_mean" else self.sequences)


@dataclass
class MicroBatch:
    """Tensors of one micro-batch. Token tensors are ``[B, T]``; ``advantages`` is ``[B]`` or ``[B, T]``."""

    logp: torch.Tensor
    old_logp: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    entropy: torch.Tensor
    ref_logp: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None
    # maxent_listwise: listwise weights [groups, K], active [groups], old sequence log-probs [B]
    maxent_weights: torch.Tensor | None = None
    maxent_active: torch.Tensor | None = None
    old_seq_logp: torch.Tensor | None = None
    # ppo: values [B, T] (with grad), old values and returns [B, T]
    values: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None


def micro_loss(
    cfg: Config, mb: MicroBatch, counts: MinibatchCounts, kl_coef: float
) -> tuple[torch.Tensor, dict]:
    """Loss of one micro-batch (already scaled by the minibatch's denominators) and its statistics."""
    a = cfg.algo
    from rlvr.objectives import build_objective

    mode = build_objective(cfg).agg_mode
    max_len = cfg.rollout.max_new_tokens
    denom = counts.for_mode(mode)
    stats: dict[str, float] = {}

    if a.objective == "maxent_listwise":
        loss, stats = _maxent_loss(cfg, mb, counts)
    else:
        loss, stats = policy_loss(
            mb.logp,
            mb.old_logp,
            mb.advantages,
            mb.mask,
            clip_low=a.clip_low,
            clip_high=a.clip_high,
            dual_clip=a.dual_clip,
            log_ratio_clamp=a.log_ratio_clamp,
            agg_mode=mode,
            max_len=max_len,
            denominator=denom,
            is_weights=mb.is_weights,
        )
        stats = dict(stats)
    stats["policy_loss"] = float(loss.detach())

    if mb.ref_logp is not None:
        kl = kl_estimate(mb.logp, mb.ref_logp, a.kl_estimator)
        kl_mean = float((kl.detach() * mb.mask).sum() / mb.mask.sum().clamp(min=1))
        stats["kl"] = kl_mean
        if a.kl_mode == "loss" and kl_coef > 0:
            loss = loss + kl_coef * aggregate(kl, mb.mask, mode, max_len=max_len, denominator=denom)

    if a.entropy_coef:
        loss = loss - a.entropy_coef * aggregate(
            mb.entropy, mb.mask, mode, max_len=max_len, denominator=denom
        )

    if mb.values is not None:
        vloss, vstats = value_loss(
            mb.values,
            mb.old_values,
            mb.returns,
            mb.mask,
            clip=a.ppo.value_clip,
            agg_mode="token_mean",
            denominator=max(1, counts.tokens),
        )
        loss = loss + a.ppo.value_coef * vloss
        stats.update({k: float(v) for k, v in vstats.items()})
        stats["value_loss"] = float(vloss.detach())
    return loss, stats


def _maxent_loss(cfg: Config, mb: MicroBatch, counts: MinibatchCounts) -> tuple[torch.Tensor, dict]:
    m = cfg.algo.maxent
    k = cfg.algo.group_size
    seq = sequence_logp(mb.logp, mb.mask, m.length_normalize_policy).view(-1, k)
    active = mb.maxent_active
    n_active = int(active.sum())
    # maxent_listwise_loss averages over the micro-batch's active groups; rescale to the minibatch's.
    scale = n_active / max(1, counts.active_groups)
    loss = maxent_listwise_loss(seq, mb.maxent_weights, active) * scale
    stats = {"maxent_listwise_loss": float(loss.detach()), "maxent_active_groups": float(n_active)}
    if m.use_clip_objective:
        old = mb.old_seq_logp.view(-1, k)
        clip = maxent_clip_term(
            seq, old, mb.maxent_weights, active, cfg.algo.clip_low, cfg.algo.clip_high
        )
        loss = loss + m.clip_objective_coef * clip * scale
        stats["maxent_clip_term"] = float(clip.detach())
    # the same ratio diagnostics as the other objectives, with the clip term's advantage w - 1/K
    adv = (mb.maxent_weights - 1.0 / k).reshape(-1)
    stats.update(
        ratio_stats(
            mb.logp,
            mb.old_logp,
            adv,
            mb.mask,
            clip_low=cfg.algo.clip_low,
            clip_high=cfg.algo.clip_high,
            log_ratio_clamp=cfg.algo.log_ratio_clamp,
        )
    )
    return loss, stats
