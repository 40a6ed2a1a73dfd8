"""Pure tensor maths of the RL objectives: advantages, losses, KL, MaxEnt-GRPO, PS-GRPO.

No model, no I/O. Shapes: rewards and sequence quantities ``[P, G]`` (P prompts, G samples
per prompt); token quantities ``[N, T]`` with a 0/1 mask, N = P * G in group-major order.
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
    LOG_RATIO_CLAMP,
    AdaptiveKLController,
    FixedKLController,
    kl_estimate,
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
from rlvr.algorithms.psgrpo import dense_step_advantages, psgrpo_step_advantages
from rlvr.algorithms.rollout_correction import rollout_correction_weights
from rlvr.algorithms.sequence_losses import (
    cispo_loss,
    gspo_loss,
    gspo_token_loss,
    overlong_penalty,
    truncated_is_weights,
)

__all__ = [
    "AGG_MODES",
    "GROUP_METHODS",
    "KL_KINDS",
    "LOG_RATIO_CLAMP",
    "AdaptiveKLController",
    "FixedKLController",
    "active_groups",
    "dense_step_advantages",
    "cispo_loss",
    "aggregate",
    "aggregate_denominator",
    "gae_advantages",
    "gspo_loss",
    "gspo_token_loss",
    "group_advantages",
    "kl_estimate",
    "last_token_rewards",
    "maxent_clip_term",
    "maxent_listwise_loss",
    "maxent_weights",
    "overlong_penalty",
    "policy_loss",
    "ratio_stats",
    "rollout_correction_weights",
    "psgrpo_step_advantages",
    "sequence_logp",
    "truncated_is_weights",
    "value_loss",
    "whiten",
]
