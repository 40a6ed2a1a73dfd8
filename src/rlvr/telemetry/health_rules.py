"""The health rules: each turns one step's metrics into "holds", "does not hold" or "no data".

Each rule's ``evaluate`` returns :data:`MISSING` (its metric is absent or NaN this step: no
state change), None (the condition does not hold) or a :class:`Finding` (it does). Rules with a
window keep their own counters; :class:`~rlvr.telemetry.health.HealthGate` handles warm-up,
``enabled``, the action and edge-triggering, so a rule is only its condition.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlvr.config.health import HealthConfig

MISSING = object()


@dataclass(frozen=True)
class Finding:
    """The numbers behind a firing rule and which advice text explains it."""

    values: dict[str, Any]
    advice_key: str
    advice_args: dict[str, Any]


def _value(metrics: Mapping[str, Any], key: str) -> float | None:
    """``metrics[key]`` as a float, None when missing or not a number (NaN is kept)."""
    value = metrics.get(key)
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _finite(metrics: Mapping[str, Any], key: str) -> float | None:
    """``metrics[key]`` as a finite float, None when missing, not a number, NaN or inf."""
    value = _value(metrics, key)
    return value if value is not None and math.isfinite(value) else None


def _update_skipped(metrics: Mapping[str, Any]) -> bool:
    flag = _value(metrics, "nonfinite_skipped")
    return flag is not None and flag >= 0.5


class _RewardStuck:
    rule = "reward_stuck"

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg.reward_stuck
        self.window = cfg.window
        self.low_run = 0
        self.high_run = 0

    def evaluate(self, metrics: Mapping[str, Any]) -> object:
        reward = _finite(metrics, "reward_mean")
        if reward is None:
            return MISSING
        self.low_run = self.low_run + 1 if reward <= self.cfg.low + self.cfg.eps else 0
        self.high_run = self.high_run + 1 if reward >= self.cfg.high - self.cfg.eps else 0
        for run, level, side in (
            (self.low_run, self.cfg.low, "low"),
            (self.high_run, self.cfg.high, "high"),
        ):
            if run >= self.window:
                values = {"reward_mean": reward, "stuck_at": level, "steps": run}
                args = {"low": self.cfg.low, "high": self.cfg.high, "steps": run}
                return Finding(values, f"reward_stuck_{side}", args)
        return None


class _HasBoxed:
    rule = "has_boxed"

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg.has_boxed
        self.window = cfg.window
        self.history: deque[float] = deque(maxlen=cfg.window)

    def evaluate(self, metrics: Mapping[str, Any]) -> object:
        boxed = _finite(metrics, "has_boxed")
        if boxed is None:
            return MISSING
        recent_max = max(self.history) if self.history else None
        self.history.append(boxed)
        if boxed < self.cfg.min_value:
            values = {"has_boxed": boxed, "min_value": self.cfg.min_value}
            return Finding(values, "has_boxed_low", values)
        if recent_max is not None and recent_max - boxed > self.cfg.max_drop:
            values = {"has_boxed": boxed, "recent_max": recent_max, "max_drop": self.cfg.max_drop}
            return Finding(values, "has_boxed_falling", {**values, "window": self.window})
        return None


class _GradNormZero:
    rule = "grad_norm_zero"

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg.grad_norm_zero
        self.window = cfg.window
        self.run = 0

    def evaluate(self, metrics: Mapping[str, Any]) -> object:
        grad_norm = _finite(metrics, "grad_norm")
        # A skipped update may report 0 (or NaN); that is the nonfinite rule's business.
        if grad_norm is None or _update_skipped(metrics):
            return MISSING
        self.run = self.run + 1 if grad_norm <= self.cfg.tolerance else 0
        if self.run >= self.window:
            return Finding(
                {"grad_norm": grad_norm, "steps": self.run}, self.rule, {"steps": self.run}
            )
        return None


class _GradNormHigh:
    rule = "grad_norm_high"

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg.grad_norm_high

    def evaluate(self, metrics: Mapping[str, Any]) -> object:
        grad_norm = _finite(metrics, "grad_norm")
        if grad_norm is None or _update_skipped(metrics):
            return MISSING
        if grad_norm > self.cfg.max_value:
            values = {"grad_norm": grad_norm, "max_value": self.cfg.max_value}
            return Finding(values, self.rule, values)
        return None


class _AdvStdZero:
    rule = "adv_std_zero"

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg.adv_std_zero
        self.window = cfg.window
        self.run = 0

    def evaluate(self, metrics: Mapping[str, Any]) -> object:
        adv_std = _finite(metrics, "adv_std")
        if adv_std is None:
            return MISSING
        self.run = self.run + 1 if adv_std <= self.cfg.tolerance else 0
        if self.run >= self.window:
            values = {"adv_std": adv_std, "steps": self.run}
            reward_std = _finite(metrics, "reward_std")
            if reward_std is not None:
                values["reward_std"] = reward_std
            return Finding(values, self.rule, {"steps": self.run})
        return None


class _Truncation:
    rule = "truncation"
    # The share of cut replies is set by the token limit from the first step, not noise that
    # settles: a run shorter than health.warmup_steps must still hear it.
    skips_warmup = True

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg.truncation

    def evaluate(self, metrics: Mapping[str, Any]) -> object:
        rate = _finite(metrics, "truncation_rate")
        if rate is None:
            return MISSING
        if rate > self.cfg.max_rate:
            values = {"truncation_rate": rate, "max_rate": self.cfg.max_rate}
            return Finding(values, self.rule, values)
        return None


class _ClipFrac:
    rule = "clip_frac"

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg.clip_frac

    def evaluate(self, metrics: Mapping[str, Any]) -> object:
        parts = [_finite(metrics, k) for k in ("clip_frac_low", "clip_frac_high")]
        present = [p for p in parts if p is not None]
        if not present:
            return MISSING
        total = sum(present)
        if total > self.cfg.max_frac:
            values = {"clip_frac": total, "max_frac": self.cfg.max_frac}
            return Finding(values, self.rule, values)
        return None


class _LogprobMismatch:
    rule = "logprob_mismatch"
    # A gap above the thresholds is a bug, not early noise; and with rollout.max_staleness >= 1
    # and an engine in the trainer's process, step 1's batch is the only fresh one it can judge.
    skips_warmup = True

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg.logprob_mismatch

    def evaluate(self, metrics: Mapping[str, Any]) -> object:
        diff = _finite(metrics, "logprob_diff_max")
        k3 = _finite(metrics, "logprob_k3")
        if diff is None and k3 is None:
            return MISSING
        # A batch (or a token) sampled by older weights than the trainer's compares two policies,
        # not the engine with the trainer: judged only on batches the current weights sampled.
        if any((_finite(metrics, k) or 0.0) > 0 for k in ("staleness_max", "token_lag_max")):
            return MISSING
        reasons = []
        values: dict[str, Any] = {}
        if diff is not None:
            values["logprob_diff_max"] = diff
            if abs(diff) > self.cfg.max_abs_diff:
                reasons.append(f"max |diff| {abs(diff):.3g} > {self.cfg.max_abs_diff:.3g}")
        if k3 is not None:
            values["logprob_k3"] = k3
            if k3 > self.cfg.max_k3:
                reasons.append(f"k3 {k3:.3g} > {self.cfg.max_k3:.3g}")
        if reasons:
            return Finding(values, self.rule, {"detail": "; ".join(reasons)})
        return None


class _Nonfinite:
    rule = "nonfinite"

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg.nonfinite
        self.run = 0

    def evaluate(self, metrics: Mapping[str, Any]) -> object:
        flag = _value(metrics, "nonfinite_skipped")
        loss = _value(metrics, "policy_loss")
        grad = _value(metrics, "grad_norm")
        if flag is None and loss is None and grad is None:
            return MISSING
        # Count the step as bad even when the trainer did not flag it but a value is NaN / inf.
        bad = _update_skipped(metrics) or any(
            v is not None and not math.isfinite(v) for v in (loss, grad)
        )
        self.run = self.run + 1 if bad else 0
        if self.run > self.cfg.max_consecutive:
            values = {"steps": self.run, "max_consecutive": self.cfg.max_consecutive}
            return Finding(values, self.rule, {"steps": self.run})
        return None


RULES = (
    _RewardStuck,
    _HasBoxed,
    _GradNormZero,
    _GradNormHigh,
    _AdvStdZero,
    _Truncation,
    _ClipFrac,
    _LogprobMismatch,
    _Nonfinite,
)
