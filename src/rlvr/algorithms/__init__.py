"""Pure tensor maths of the RL objectives: advantages, losses, KL, MaxEnt-GRPO, PS-GRPO.

No model, no I/O. Shapes: rewards and sequence quantities ``[P, G]`` (P prompts, G samples
per prompt); token quantities ``[N, T]`` with a 0/1 mask, N = P * G in group-major order.
Importing this package registers every estimator and loss by name (see ``registry``).
"""

from rlvr.algorithms.advantages import (
    GROUP_METHODS,
    gae_advantages,
    group_advantages,
    last_token_rewards,
    whiten,
)
from rlvr.algorithms.kl import (
    KL_KINDS,
    AdaptiveKLController,
    FixedKLController,
    kl_estimate,
    kl_penalty_rewards,
)
from rlvr.algorithms.losses import (
    AGG_MODES,
    aggregate,
    aggregate_denominator,
    policy_loss,
    ratio_stats,
    value_loss,
)
from rlvr.algorithms.maxent import (
    active_groups,
    maxent_clip_term,
    maxent_listwise_loss,
    maxent_weights,
    sequence_logp,
)
from rlvr.algorithms.psgrpo import psgrpo_step_advantages
from rlvr.algorithms.registry import (
    advantage_names,
    get_advantage,
    get_loss,
    loss_names,
    register_advantage,
    register_loss,
)

__all__ = [
    "AGG_MODES",
    "GROUP_METHODS",
    "KL_KINDS",
    "AdaptiveKLController",
    "FixedKLController",
    "active_groups",
    "advantage_names",
    "aggregate",
    "aggregate_denominator",
    "gae_advantages",
    "get_advantage",
    "get_loss",
    "group_advantages",
    "kl_estimate",
    "kl_penalty_rewards",
    "last_token_rewards",
    "loss_names",
    "maxent_clip_term",
    "maxent_listwise_loss",
    "maxent_weights",
    "policy_loss",
    "ratio_stats",
    "psgrpo_step_advantages",
    "register_advantage",
    "register_loss",
    "sequence_logp",
    "value_loss",
    "whiten",
]
