"""PPO with a learned critic (arXiv 1707.06347): GAE advantages (arXiv 1506.02438) over tokens."""

from __future__ import annotations

from rlvr.objectives.base import Objective, register


@register("ppo")
class PPO(Objective):
    default_loss_agg = "token_mean"
