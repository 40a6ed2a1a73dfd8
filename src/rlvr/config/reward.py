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

    name: str
    weight: float = 1.0
    kwargs: dict[str, Any] = Field(default_factory=dict)

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
    timeout_s: float = Field(5.0, gt=0)
    max_failure_fraction: float = Field(0.5, ge=0.0, le=1.0)
