"""Process-reward-model step scores as a dense per-token reward (the legacy mode beside PS-GRPO):
each step's score on its last token, the outcome on the reply's last token, advantages from the
return-to-go minus the group's mean return (`rlvr.algorithms.dense_step_advantages`).

Same PRM settings as ``psgrpo_steps`` (``algo.psgrpo.*``).
"""

from __future__ import annotations

import numpy as np

from rlvr.algorithms import dense_step_advantages
from rlvr.objectives.base import register
from rlvr.objectives.batch import RolloutBatch
from rlvr.objectives.psgrpo import PSGRPOSteps


@register("prm_dense")
class PRMDense(PSGRPOSteps):
    def prepare(self, batch: RolloutBatch) -> dict[str, float]:
        comp_ids = batch.comp_ids
        texts = [c.text for c in batch.completions]
        step_scores, step_ids = self.scorer(self.tokenizer, batch.seq_prompt_texts, texts, comp_ids)
        mask = batch.token_mask()[:, : step_ids.shape[1]]
        adv = dense_step_advantages(
            step_scores, batch.scores, step_ids, mask, batch.group_size, valid=batch.valid
        )
        batch.advantages = [adv[i, : len(c)] for i, c in enumerate(comp_ids)]
        flat = [x for s in step_scores for x in s]
        return {
            "step_count_mean": float(np.mean([len(s) for s in step_scores])),
            "step_score_mean": float(np.mean(flat)) if flat else 0.0,
        }
