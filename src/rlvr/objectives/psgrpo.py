"""PS-GRPO "variant 2" (URSA, arXiv 2501.04686): per-token advantages from process-reward-model
step scores plus the group-normalised outcome (`rlvr.algorithms.psgrpo_step_advantages`).

The PRM scores each reply's steps; `rlvr.objectives.psgrpo_steps` maps steps onto tokens through
the tokenizer's character offsets.
"""

from __future__ import annotations

import numpy as np

from rlvr.algorithms import psgrpo_step_advantages
from rlvr.objectives.base import Objective, register
from rlvr.objectives.batch import RolloutBatch
from rlvr.objectives.psgrpo_steps import StepScorer
from rlvr.rewards.registry import build_prm


@register("psgrpo_steps")
class PSGRPOSteps(Objective):
    supports_episodes = False  # the PRM scores one reply's steps (prm_dense inherits it)

    @classmethod
    def check(cls, cfg) -> list[str]:
        if not cfg.algo.psgrpo.prm:
            return [
                f"algo.objective={cls.name} needs algo.psgrpo.prm (a PRM model folder or 'pkg.mod:fn')"
            ]
        return []

    def __init__(self, cfg, tokenizer=None) -> None:
        super().__init__(cfg, tokenizer)

        ps = cfg.algo.psgrpo
        prm = (
            build_prm(ps.prm)
            if ":" in ps.prm
            else build_prm(ps.prm, tag_token=ps.tag_token, label_index=ps.label_index)
        )
        self.scorer = StepScorer(prm, ps.step_pattern, ps.answer_pattern)

    def prepare(self, batch: RolloutBatch) -> dict[str, float]:
        comp_ids = batch.comp_ids
        step_scores, step_ids = self.scorer(
            self.tokenizer,
            batch.seq_prompt_texts,
            [c.text for c in batch.completions],
            comp_ids,
        )
        mask = batch.token_mask()[:, : step_ids.shape[1]]
        adv = psgrpo_step_advantages(
            step_scores,
            batch.scores,
            step_ids,
            mask,
            batch.group_size,
            self.cfg.algo.adv_eps,
            valid=batch.valid,
        )
        batch.advantages = [adv[i, : len(c)] for i, c in enumerate(comp_ids)]
        counts = [len(s) for s in step_scores]
        flat = [x for s in step_scores for x in s]
        return {
            "step_count_mean": float(np.mean(counts)),
            "step_score_mean": float(np.mean(flat)) if flat else 0.0,
        }
