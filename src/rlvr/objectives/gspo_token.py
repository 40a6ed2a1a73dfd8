"""GSPO-token (arXiv 2507.18071, section 4.3): per-token advantages with GSPO's sequence ratio.

Each token's ratio has the value of its sequence's ratio ``s_i = exp(mean_t log-ratio)`` and the
gradient ``s_i * grad log pi(token)`` (`rlvr.algorithms.gspo_token_loss`), so an objective whose
advantages vary along a reply, PS-GRPO's step advantages or the dense PRM reward, can take the
sequence-level clip. ``algo.gspo_token.advantages`` names where the advantages come from: a group
objective (grpo, the paper's GSPO advantages, drgrpo, rloo: one value on every token, where
GSPO-token equals GSPO in value and gradient) or a PRM objective (psgrpo_steps, prm_dense: one
value per token). The clip defaults and rules are GSPO's; unlike GSPO the per-token terms take the
rollout correction's weights (``algo.rollout_correction``).
"""

from __future__ import annotations

import torch

from rlvr.algorithms import gspo_token_loss
from rlvr.objectives.base import OBJECTIVES, ratio_diagnostics, register
from rlvr.objectives.batch import MicroBatch, MinibatchCounts, RolloutBatch
from rlvr.objectives.gspo import GSPO

# the objectives whose prepare() gives plain advantages that the GSPO-token loss can take
ADVANTAGE_SOURCES = ("grpo", "drgrpo", "rloo", "psgrpo_steps", "prm_dense")


@register("gspo_token")
class GSPOToken(GSPO):
    supports_tis = True  # a per-token term: the correction weights multiply it

    @classmethod
    def check(cls, cfg) -> list[str]:
        out = super().check(cfg)
        source = cfg.algo.gspo_token.advantages
        if source not in ADVANTAGE_SOURCES:
            out.append(
                f"algo.gspo_token.advantages={source!r} is unknown; known: "
                f"{', '.join(ADVANTAGE_SOURCES)}"
            )
        else:
            out.extend(OBJECTIVES[source].check(cfg))
            if cfg.episodes and not OBJECTIVES[source].takes_episodes(cfg):
                out.append(
                    f"algo.gspo_token.advantages={source} with env.name: its PRM would score "
                    "whole episodes, tool output included; use grpo, drgrpo or rloo"
                )
        return out

    @classmethod
    def takes_episodes(cls, cfg) -> bool:
        """Its advantages are the source's: episodes only where the source takes them (a PRM
        source scores one reply's steps, not an episode's turns and tool output)."""
        source = OBJECTIVES.get(cfg.algo.gspo_token.advantages)
        return cls.supports_episodes and (source is None or source.takes_episodes(cfg))

    def __init__(self, cfg, tokenizer=None) -> None:
        super().__init__(cfg, tokenizer)
        self.source = OBJECTIVES[cfg.algo.gspo_token.advantages](cfg, tokenizer)

    def prepare(self, batch: RolloutBatch) -> dict[str, float]:
        return self.source.prepare(batch)

    def policy_term(self, mb: MicroBatch, counts: MinibatchCounts) -> tuple[torch.Tensor, dict]:
        a = self.cfg.algo
        loss, stats = gspo_token_loss(
            mb.logp,
            mb.old_logp,
            mb.advantages,
            mb.mask,
            a.clip_low,
            a.clip_high,
            denominator=max(1, counts.sequences),
            is_weights=mb.tok.get("tis_weights"),
        )
        return loss, {**ratio_diagnostics(mb, a.log_ratio_clamp), **stats}
