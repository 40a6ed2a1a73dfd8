"""What a checkpoint saves and restores, as a protocol: checkpoint I/O needs these fields and
nothing else of the trainer (`rlvr.training.state.TrainState` is the one implementation)."""

from __future__ import annotations

from typing import Any, Protocol

import torch


class Stateful(Protocol):
    """Anything with torch's ``state_dict`` / ``load_state_dict`` pair."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


class HasValue(Protocol):
    value: float  # the KL controller's current coefficient


class ObjectiveState(Stateful, Protocol):
    def modules(self) -> dict[str, torch.nn.Module]: ...


class Checkpointable(Protocol):
    """The train state as checkpoints see it."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Stateful
    sampler: Stateful
    kl_ctl: HasValue
    objective: ObjectiveState
    step: int
    policy_version: int
