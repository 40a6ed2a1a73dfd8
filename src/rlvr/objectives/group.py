"""Group-relative policy gradients: Dr.GRPO (arXiv 2503.20783), GRPO (arXiv 2402.03300), RLOO
(arXiv 2402.14740). One sequence-level advantage per completion from its prompt group's rewards,
then the clipped surrogate of PPO (arXiv 1707.06347) over its tokens."""

from __future__ import annotations

from rlvr.objectives.base import Objective, register


class GroupObjective(Objective):
    """Advantages from `rlvr.algorithms.group_advantages` with method ``advantage_method``."""

    advantage_method = "drgrpo"


@register("drgrpo")
class DrGRPO(GroupObjective):
    advantage_method = "drgrpo"


@register("grpo")
class GRPO(GroupObjective):
    advantage_method = "grpo"
    default_loss_agg = "seq_mean_token_mean"


@register("rloo")
class RLOO(GroupObjective):
    advantage_method = "rloo"
