"""Rewards: maths answer grading, Countdown, process reward models, and the batch runner.

The light parts are imported here; the runner (pydantic) and the Hugging Face PRM
(torch) load on first access, so a sandbox child process that imports this package
starts fast.
"""

from typing import Any

from rlvr.rewards.base import RewardFn, RewardResult
from rlvr.rewards.countdown import grade_countdown
from rlvr.rewards.math import extract_answer, grade
from rlvr.rewards.prm import (
    CallablePRM,
    MathPRMReward,
    ProcessRewardModel,
    PSGRPOReward,
    drop_moment,
    math_prm_reward,
    psgrpo_reward,
    split_steps,
)

_LAZY = {
    "BatchRewards": "rlvr.rewards.runner",
    "RewardFailureError": "rlvr.rewards.runner",
    "RewardRunner": "rlvr.rewards.runner",
    "RewardSpec": "rlvr.config.reward",
    "builtin_reward_names": "rlvr.rewards.runner",
    "resolve_reward_names": "rlvr.rewards.runner",
    "validate_reward_spec": "rlvr.rewards.runner",
    "HFTokenClassificationPRM": "rlvr.rewards.prm_hf",
}

__all__ = [
    "CallablePRM",
    "MathPRMReward",
    "PSGRPOReward",
    "ProcessRewardModel",
    "RewardFn",
    "RewardResult",
    "drop_moment",
    "extract_answer",
    "grade",
    "grade_countdown",
    "math_prm_reward",
    "psgrpo_reward",
    "split_steps",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rlvr.rewards' has no attribute {name!r}")
