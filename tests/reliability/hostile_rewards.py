"""Reward functions that fail on purpose, named in configs as ``reliability.hostile_rewards:NAME``.

``by_reference`` reads the fault to inject from the dataset row's reference answer, so a data file
fixes exactly which prompts fail and how, whatever the model generates:

    ok          the fraction of '7' characters in the response (a learnable, finite score)
    raise       raises ValueError
    hang        sleeps far past any time limit (the runner must kill it)
    nan / inf   returns float("nan") / float("inf")
    none        returns None
    wrong_type  returns the string "1.0"
    bad_info    returns a RewardResult whose info holds a NaN

Every mode except ``ok`` must make the sample invalid.
"""

from __future__ import annotations

import time

from rlvr.rewards.base import RewardResult

FAULT_MODES = ("raise", "hang", "nan", "inf", "none", "wrong_type", "bad_info")
HANG_SECONDS = 3600.0


def sevens(response: str) -> float:
    """Fraction of the response's characters that are '7' (0.0 for an empty response)."""
    return response.count("7") / max(1, len(response))


def by_reference(prompt: str, response: str, reference: str, **row: object) -> object:
    """Score like ``sevens`` or fail in the way the reference names (see the module docstring)."""
    mode = reference
    if mode == "ok":
        return sevens(response)
    if mode == "raise":
        raise ValueError(f"injected failure for prompt {prompt!r}")
    if mode == "hang":
        time.sleep(HANG_SECONDS)
        return 0.0
    if mode == "nan":
        return float("nan")
    if mode == "inf":
        return float("inf")
    if mode == "none":
        return None
    if mode == "wrong_type":
        return "1.0"
    if mode == "bad_info":
        return RewardResult(0.5, {"note": float("nan")})
    raise AssertionError(f"unknown fault mode {mode!r}; known: ok, {', '.join(FAULT_MODES)}")
