"""CISPO, clipped importance-sampling-weight policy optimisation (MiniMax-M1, arXiv 2506.13585):
per token ``-stopgrad(clip(r_t, 1 - clip_low, 1 + clip_high)) * A * logp_t``, a token mean over
the minibatch (`rlvr.algorithms.cispo_loss`), with GRPO's group-normalised advantages.

Unlike PPO's clip, which drops the gradient of a token whose ratio left the range, CISPO clips
the weight and keeps every token's gradient (the paper's point: rare "fork" tokens with large
ratios keep contributing). The range is ``algo.clip_low/high``; ``algo.clip_low=1`` removes the
lower bound, as the paper does (it tunes only the upper one). The weight only differs from 1
when the batch is reused (``algo.minibatches`` or ``algo.epochs_per_batch`` > 1).

The policy term is always a token mean over the minibatch's tokens, so ``algo.loss_agg`` must be
``auto`` or ``token_mean`` (it also aggregates the KL and entropy terms).
"""

from __future__ import annotations

import torch

from rlvr.algorithms import cispo_loss
from rlvr.objectives.base import ratio_diagnostics, register
from rlvr.objectives.batch import MicroBatch, MinibatchCounts
from rlvr.objectives.group import GroupObjective


@register("cispo")
class CISPO(GroupObjective):
    advantage_method = "grpo"
    default_loss_agg = "token_mean"

    @classmethod
    def check(cls, cfg) -> list[str]:
        a, out = cfg.algo, []
        if a.loss_agg not in ("auto", "token_mean"):
            out.append(
                f"algo.objective=cispo is a token mean over the batch (arXiv 2506.13585); "
                f"algo.loss_agg must be auto or token_mean, got {a.loss_agg!r}"
            )
        if a.clip_low > 1.0:
            out.append(
                f"algo.clip_low={a.clip_low}: must be <= 1 with cispo (1 = no lower bound on the "
                "importance weight, the paper's setting)"
            )
        if a.dual_clip is not None:
            out.append("algo.dual_clip is not used by algo.objective=cispo; leave it null")
        return out

    def policy_term(self, mb: MicroBatch, counts: MinibatchCounts) -> tuple[torch.Tensor, dict]:
        a = self.cfg.algo
        loss, stats = cispo_loss(
            mb.logp,
            mb.old_logp,
            mb.advantages,
            mb.mask,
            a.clip_low,
            a.clip_high,
            denominator=max(1, counts.tokens),
            is_weights=mb.tok.get("tis_weights"),
        )
        return loss, {**ratio_diagnostics(mb, a.log_ratio_clamp), **stats}
