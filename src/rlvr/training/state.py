"""TrainState: everything a checkpoint saves and restores, passed explicitly to whoever needs it.

``policy_version`` counts the updates that changed the weights; a rollout engine records the
version it holds, and the loop syncs the engine whenever the two differ before it generates or
evaluates (after a restore, with ``rollout.sync_every > 1``, before an eval or ``save_best``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.algorithms import AdaptiveKLController, FixedKLController
from rlvr.objectives import Objective
from rlvr.training.batching import PromptSampler


@dataclass
class TrainState:
    model: torch.nn.Module  # the plain module (generate, save, adapters)
    optimizer: torch.optim.Optimizer
    scheduler: object
    sampler: PromptSampler
    kl_ctl: AdaptiveKLController | FixedKLController
    objective: Objective  # its own trainable modules (PPO's critic) are part of the state
    step: int = 0  # steps completed; only the run loop moves it
    policy_version: int = 0  # updates applied to the weights

    def trainable_params(self) -> list[torch.nn.Parameter]:
        """Everything the optimizer updates: the policy's trainable weights and the objective's."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]
