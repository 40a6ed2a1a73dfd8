"""The `reward` section: which rewards score a completion, with what weight, and their limits."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlvr.config.base import Section


class RewardSpec(BaseModel):
    """One configured reward: a built-in name or ``package.module:function``, its weight
    in the sum, and keyword arguments (a built-in's options, or extra keywords for a user
    function)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        description="A built-in (math, gsm8k, countdown, ...) or your function as "
        "'module:function' (importable: the directory rlvr runs in, or PYTHONPATH)."
    )
    weight: float = Field(1.0, description="Its weight in the sum of rewards.")
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra keyword arguments of every call."
    )

    @field_validator("weight")
    @classmethod
    def _finite_weight(cls, weight: float) -> float:
        if not math.isfinite(weight):
            raise ValueError(f"weight must be finite, got {weight}")
        return weight


class RewardConfig(Section):
    specs: list[RewardSpec] = Field(
        default_factory=list,
        description="Rewards and weights; empty picks the task's own reward (math / countdown).",
    )
    timeout_s: float = Field(5.0, gt=0, description="Longest time one reward call may take.")
    max_failure_fraction: float = Field(
        0.5, ge=0.0, le=1.0, description="More of a batch failing to score stops the run."
    )
    overlong_buffer: int = Field(
        0,
        ge=0,
        description="DAPO soft overlong punishment (arXiv 2503.14476): the last N tokens before "
        "rollout.max_new_tokens cost linearly up to reward.overlong_factor, added to every "
        "objective's reward; 0 turns it off.",
    )
    overlong_factor: float = Field(
        1.0, ge=0.0, description="Penalty at rollout.max_new_tokens (and beyond)."
    )
