"""Group-relative policy gradients: Dr.GRPO (arXiv 2503.20783), GRPO (arXiv 2402.03300) and RLOO
(arXiv 2402.14740). One sequence-level advantage per completion from its prompt group's rewards,
then the clipped surrogate of PPO (arXiv 1707.06347) over its tokens."""

from __future__ import annotations

from rlvr.algorithms import group_advantages
from rlvr.objectives.base import Objective, register
from rlvr.objectives.batch import RolloutBatch


class GroupObjective(Objective):
    """Advantages from `rlvr.algorithms.group_advantages` with method ``advantage_method``."""

    advantage_method = "drgrpo"

    def prepare(self, batch: RolloutBatch) -> dict[str, float]:
        adv = group_advantages(
            batch.scores,
            batch.group_size,
            self.advantage_method,
            valid=batch.valid,
            eps=self.cfg.algo.adv_eps,
        )
        batch.advantages = adv.reshape(-1)
        return {}


@register("drgrpo")
class DrGRPO(GroupObjective):
    """r - mean(group r), no std division, sequence sums over a constant (arXiv 2503.20783)."""

    advantage_method = "drgrpo"


@register("grpo")
class GRPO(GroupObjective):
    """(r - mean) / std within the group, token mean per sequence (arXiv 2402.03300)."""

    advantage_method = "grpo"
    default_loss_agg = "seq_mean_token_mean"


@register("rloo")
class RLOO(GroupObjective):
    """r minus the mean of the other samples of the group (arXiv 2402.14740)."""

    advantage_method = "rloo"
