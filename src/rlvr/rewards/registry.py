"""Built-in rewards by name, and how a config names a user's reward function.

A built-in is a factory ``make(**kwargs) -> reward`` whose reward has the uniform
signature ``reward(prompt, response, reference, *, truncated=False, **row) -> RewardResult``.
Its keyword arguments are the ``kwargs`` of a ``RewardSpec``; ``check_kwargs`` validates
them against the factory's signature without building anything (no model is loaded).

Any other name must be ``package.module:function``: a user function
``f(prompt, response, reference, **row) -> float | RewardResult``.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

from rlvr.rewards.base import RewardResult
from rlvr.rewards.code import make_code
from rlvr.rewards.countdown import grade_countdown
from rlvr.rewards.math import DEFAULT_SYMBOLIC_TIMEOUT_S, grade
from rlvr.rewards.prm import (
    DEFAULT_ANSWER_PATTERN,
    DEFAULT_STEP_PATTERN,
    CallablePRM,
    MathPRMReward,
    ProcessRewardModel,
    PSGRPOReward,
)
from rlvr.rewards.sandbox import resolve_target

__all__ = [
    "BUILTIN_REWARDS",
    "POOLED_BUILTINS",
    "POOLED_PRELOAD",
    "build_prm",
    "check_kwargs",
    "is_user_target",
    "make_builtin",
]

_TARGET_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")

Reward = Callable[..., RewardResult]


def is_user_target(name: str) -> bool:
    """True if ``name`` has the ``package.module:function`` form."""
    return bool(_TARGET_RE.match(name))


def make_math(*, timeout_s: float = DEFAULT_SYMBOLIC_TIMEOUT_S, symbolic: bool = True) -> Reward:
    """Exact-answer maths grading (``rlvr.rewards.math.grade``)."""
    if timeout_s <= 0:
        raise ValueError(f"math reward: timeout_s must be positive, got {timeout_s}")

    def math_reward(
        prompt: str, response: str, reference: str, *, truncated: bool = False, **row: Any
    ) -> RewardResult:
        return grade(
            response, reference, truncated=truncated, symbolic=symbolic, timeout_s=timeout_s
        )

    return math_reward


def make_gsm8k(*, timeout_s: float = DEFAULT_SYMBOLIC_TIMEOUT_S, symbolic: bool = False) -> Reward:
    """GSM8K: the reference may be a full solution ending ``#### x``; answers are numbers,
    so the symbolic stage is off by default."""
    return make_math(timeout_s=timeout_s, symbolic=symbolic)


def make_countdown(*, numbers_key: str = "numbers", target_key: str = "target") -> Reward:
    """Countdown equations; the row must hold the given numbers and the target."""

    def countdown_reward(
        prompt: str, response: str, reference: str, *, truncated: bool = False, **row: Any
    ) -> RewardResult:
        missing = [key for key in (numbers_key, target_key) if key not in row]
        if missing:
            raise KeyError(
                f"countdown reward needs row fields {missing}; the row has {sorted(row)}"
            )
        return grade_countdown(response, row[numbers_key], row[target_key])

    return countdown_reward


def build_prm(prm: str | ProcessRewardModel, **hf_kwargs: Any) -> ProcessRewardModel:
    """A PRM from a config value: an object with ``score_steps``; ``"package.module:function"``
    naming ``fn(prompt, steps) -> list[float]``; or a local directory / hub id of a
    token-classification model (``hf_kwargs`` go to ``HFTokenClassificationPRM``)."""
    if isinstance(prm, ProcessRewardModel):
        return prm
    if not isinstance(prm, str) or not prm:
        raise ValueError(
            f"prm must be a model path, a 'package.module:function' or a PRM, got {prm!r}"
        )
    if is_user_target(prm):
        return CallablePRM(resolve_target(prm))
    from rlvr.rewards.prm_hf import HFTokenClassificationPRM

    if "dtype" in hf_kwargs and isinstance(hf_kwargs["dtype"], str):
        import torch

        hf_kwargs["dtype"] = getattr(torch, hf_kwargs["dtype"])
    return HFTokenClassificationPRM(prm, **hf_kwargs)


_PRM_KWARGS = ("tag_token", "label_index", "device", "dtype", "max_length")


def make_psgrpo(
    *,
    prm: str | ProcessRewardModel,
    rho: float = 0.3,
    gamma: float = 0.5,
    min_steps: int = 2,
    step_pattern: str = DEFAULT_STEP_PATTERN,
    answer_pattern: str = DEFAULT_ANSWER_PATTERN,
    timeout_s: float = DEFAULT_SYMBOLIC_TIMEOUT_S,
    tag_token: str = "ки",
    label_index: int = 0,
    device: str = "cpu",
    dtype: str | None = None,
    max_length: int | None = None,
) -> Reward:
    """PS-GRPO (``rlvr.rewards.prm.PSGRPOReward``) with the PRM built by ``build_prm``."""
    local = locals()
    model = build_prm(prm, **{k: local[k] for k in _PRM_KWARGS if local[k] is not None})
    reward = PSGRPOReward(
        model,
        rho=rho,
        gamma=gamma,
        min_steps=min_steps,
        step_pattern=step_pattern,
        answer_pattern=answer_pattern,
        timeout_s=timeout_s,
    )
    return _drop_truncated(reward)


def make_math_prm(
    *,
    prm: str | ProcessRewardModel,
    min_steps: int = 2,
    step_pattern: str = DEFAULT_STEP_PATTERN,
    answer_pattern: str = DEFAULT_ANSWER_PATTERN,
    timeout_s: float = DEFAULT_SYMBOLIC_TIMEOUT_S,
    tag_token: str = "ки",
    label_index: int = 0,
    device: str = "cpu",
    dtype: str | None = None,
    max_length: int | None = None,
) -> Reward:
    """Minimum PRM step score (``rlvr.rewards.prm.MathPRMReward``)."""
    local = locals()
    model = build_prm(prm, **{k: local[k] for k in _PRM_KWARGS if local[k] is not None})
    reward = MathPRMReward(
        model,
        min_steps=min_steps,
        step_pattern=step_pattern,
        answer_pattern=answer_pattern,
        timeout_s=timeout_s,
    )
    return _drop_truncated(reward)


def _drop_truncated(reward: Callable[..., RewardResult]) -> Reward:
    def call(
        prompt: str, response: str, reference: str, *, truncated: bool = False, **row: Any
    ) -> RewardResult:
        return reward(prompt, response, reference, **row)

    return call


BUILTIN_REWARDS: dict[str, Callable[..., Reward]] = {
    "math": make_math,
    "gsm8k": make_gsm8k,
    "countdown": make_countdown,
    "psgrpo": make_psgrpo,
    "math_prm": make_math_prm,
    "code": make_code,
}


# Built-ins that call another package's code (which may hang): they run in the sandbox workers
# as user functions do, by these targets, and take no kwargs. The workers import the package
# before they report ready (POOLED_PRELOAD), so no call's time limit pays for it.
POOLED_BUILTINS: dict[str, str] = {"reasoning_gym": "rlvr.rewards.reasoning_gym:score"}
POOLED_PRELOAD: dict[str, tuple[str, ...]] = {"reasoning_gym": ("reasoning_gym",)}


def check_kwargs(name: str, kwargs: dict[str, Any]) -> None:
    """Check ``kwargs`` against built-in ``name``'s factory signature; ValueError if they
    do not fit (unknown or missing keys named, with the accepted ones)."""
    params = inspect.signature(BUILTIN_REWARDS[name]).parameters
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        raise ValueError(f"reward {name!r}: unknown kwargs {unknown}; accepted: {sorted(params)}")
    missing = sorted(k for k, p in params.items() if p.default is p.empty and k not in kwargs)
    if missing:
        raise ValueError(f"reward {name!r}: missing required kwargs {missing}")


def make_builtin(name: str, kwargs: dict[str, Any]) -> Reward:
    """Build built-in ``name``; unknown names fail with the list of known ones."""
    if name not in BUILTIN_REWARDS:
        raise ValueError(f"unknown built-in reward {name!r}; known: {sorted(BUILTIN_REWARDS)}")
    check_kwargs(name, kwargs)
    return BUILTIN_REWARDS[name](**kwargs)
