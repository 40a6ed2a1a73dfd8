"""GSPO, group sequence policy optimisation (arXiv 2507.18071): one importance ratio per sequence,
``s_i = exp(mean_t (logp - old_logp))``, clipped as a whole (`rlvr.algorithms.gspo_loss`), with
GRPO's group-normalised advantages (r - mean) / std.

Clip range: a sequence ratio is a geometric mean of token ratios, so it stays far closer to 1
than any token's; the paper clips it to [1 - 3e-4, 1 + 4e-4]. The objective brings those values
(``defaults``) where the config sets no ``algo.clip_low``/``clip_high``; PPO's token range 0.2
would never bind here, so ``check`` refuses a clip above 0.01 that the config sets itself.
The clip only matters when the batch is reused (``algo.minibatches`` or
``algo.epochs_per_batch`` > 1); with one update per batch every s_i is 1.

``algo.loss_agg`` (auto: seq_mean_token_mean) aggregates only the KL and entropy terms: the
policy term is always a mean over the minibatch's sequences.
"""

from __future__ import annotations

import torch

from rlvr.algorithms import gspo_loss
from rlvr.objectives.base import ratio_diagnostics, register
from rlvr.objectives.batch import MicroBatch, MinibatchCounts
from rlvr.objectives.group import GroupObjective

PAPER_CLIP = (3e-4, 4e-4)  # (clip_low, clip_high), arXiv 2507.18071
MAX_CLIP = 0.01  # above this the sequence clip is a token-level range by mistake


@register("gspo")
class GSPO(GroupObjective):
    advantage_method = "grpo"
    default_loss_agg = "seq_mean_token_mean"
    supports_tis = False  # one ratio per sequence: a per-token IS weight has no place in it
    defaults = {"clip_low": PAPER_CLIP[0], "clip_high": PAPER_CLIP[1]}

    @classmethod
    def check(cls, cfg) -> list[str]:
        a, out = cfg.algo, []
        if a.clip_low > MAX_CLIP or a.clip_high > MAX_CLIP:
            out.append(
                f"algo.objective={cls.name} clips the sequence ratio, not token ratios: "
                f"algo.clip_low={a.clip_low} / algo.clip_high={a.clip_high} (> {MAX_CLIP}) would "
                f"never bind; leave them unset for the paper's algo.clip_low={PAPER_CLIP[0]} "
                f"algo.clip_high={PAPER_CLIP[1]} (arXiv 2507.18071), as recipes/gspo.yaml sets"
            )
        if a.dual_clip is not None:
            out.append(f"algo.dual_clip is not used by algo.objective={cls.name}; leave it null")
        return out

    def policy_term(self, mb: MicroBatch, counts: MinibatchCounts) -> tuple[torch.Tensor, dict]:
        a = self.cfg.algo
        loss, stats = gspo_loss(
            mb.logp,
            mb.old_logp,
            mb.advantages,
            mb.mask,
            a.clip_low,
            a.clip_high,
            denominator=max(1, counts.sequences),
        )
        return loss, {**ratio_diagnostics(mb, a.log_ratio_clamp), **stats}
