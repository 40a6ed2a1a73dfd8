"""The `eval` section of the run config."""

from __future__ import annotations

from pydantic import Field

from rlvr.config_base import Section


class EvalConfig(Section):
    before_after: bool = Field(
        True, description="Greedy eval on the held-out split before and after."
    )
    every: int = Field(0, ge=0, description="Also evaluate every N steps (0: never).")
    max_problems: int = Field(100, gt=0)
    max_new_tokens: int | None = Field(None, description="Default: rollout.max_new_tokens.")
