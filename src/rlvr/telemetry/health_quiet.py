"""Health rules for the quiet failures: runs whose headline numbers look fine while the policy
collapses or diverges underneath (entropy, reply length, importance ratios, KL, grad spikes, and
training reward rising while a held-out metric falls).

Same contract as :mod:`rlvr.telemetry.health_rules`: ``evaluate`` returns ``MISSING``, None or a
``Finding``; the gate handles warm-up, ``enabled``, the action and edge-triggering.
"""

from __future__ import annotations

import re
import statistics
from collections import deque
from collections.abc import Mapping
from typing import Any

from rlvr.config.health import HealthConfig
from rlvr.telemetry.health_rules import MISSING, Finding, _finite, _update_skipped

EVAL_METRIC = re.compile(r"^eval/[^/]+/[^/]+@\d+$")


class _EntropyCollapse:
    rule = "entropy_collapse"

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg.entropy_collapse
        self.history: deque[float] = deque(maxlen=cfg.window)

    def evaluate(self, metrics: Mapping[str, Any]) -> object:
        entropy = _finite(metrics, "entropy_mean")
        if entropy is None:
            return MISSING
        recent_max = max(self.history) if self.history else None
        self.history.append(entropy)
        if entropy < self.cfg.min_entropy:
            values = {"entropy_mean": entropy, "min_entropy": self.cfg.min_entropy}
            return Finding(values, "entropy_low", values)
        if recent_max is not None and entropy < (1.0 - self.cfg.max_drop) * recent_max:
            values = {"entropy_mean": entropy, "recent_max": recent_max}
            return Finding(values, "entropy_falling", {**values, "steps": len(self.history)})
        return None


class _LengthCollapse:
    rule = "length_collapse"

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg.length_collapse
        self.baseline: tuple[float, float] | None = None  # (median length, reward) at first check

    def evaluate(self, metrics: Mapping[str, Any]) -> object:
        length = _finite(metrics, "response_len_p50")
        reward = _finite(metrics, "reward_mean")
        if length is None or reward is None:
            return MISSING
        if self.baseline is None:
            self.baseline = (length, reward)
            return None
        base_len, base_reward = self.baseline
        shrunk = length < (1.0 - self.cfg.max_drop) * base_len
        if shrunk and reward < base_reward + self.cfg.min_reward_gain:
            values = {
                "response_len_p50": length,
                "baseline_len": base_len,
                "reward_mean": reward,
                "baseline_reward": base_reward,
            }
            return Finding(values, self.rule, values)
        return None


class _RatioExplosion:
    rule = "ratio_explosion"

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg.ratio_explosion
        self.run = 0

    def evaluate(self, metrics: Mapping[str, Any]) -> object:
        ratio = _finite(metrics, "ratio_max")
        p99 = _finite(metrics, "log_ratio_abs_p99")
        if (ratio is None and p99 is None) or _update_skipped(metrics):
            return MISSING
        high = (ratio is not None and ratio > self.cfg.max_ratio) or (
            p99 is not None and p99 > self.cfg.max_log_ratio_p99
        )
        self.run = self.run + 1 if high else 0
        if self.run >= self.cfg.steps:
            values = {"ratio_max": ratio, "log_ratio_abs_p99": p99, "steps": self.run}
            args = {
                "ratio_max": ratio if ratio is not None else float("nan"),
                "p99": p99 if p99 is not None else float("nan"),
                "steps": self.run,
            }
            return Finding(values, self.rule, args)
        return None


class _KLSpike:
    rule = "kl_spike"

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg.kl_spike
        self.history: deque[float] = deque(maxlen=self.cfg.history)

    def evaluate(self, metrics: Mapping[str, Any]) -> object:
        kl = _finite(metrics, "kl")
        if kl is None:
            return MISSING
        median = statistics.median(self.history) if len(self.history) >= 3 else None
        self.history.append(kl)
        if median is None or median < self.cfg.min_kl:
            return None  # KL still near 0 (the first steps from the reference): no scale yet
        if kl > self.cfg.factor * median:
            values = {"kl": kl, "running_median": median, "factor": self.cfg.factor}
            return Finding(values, self.rule, values)
        return None


class _GradSpikes:
    rule = "grad_spikes"

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg.grad_spikes
        self.norms: deque[float] = deque(maxlen=self.cfg.within)
        self.spikes: list[tuple[int, float]] = []  # (checked-step index, grad_norm)
        self.index = 0

    def evaluate(self, metrics: Mapping[str, Any]) -> object:
        norm = _finite(metrics, "grad_norm")
        if norm is None or _update_skipped(metrics):
            return MISSING
        self.index += 1
        median = statistics.median(self.norms) if len(self.norms) >= 3 else None
        self.norms.append(norm)
        if median is None or norm <= max(self.cfg.factor * median, self.cfg.min_norm):
            return None
        # keep the spikes inside the window, and only a growing sequence
        self.spikes = [(i, g) for i, g in self.spikes if self.index - i < self.cfg.within]
        if self.spikes and norm <= self.spikes[-1][1]:
            self.spikes = []
        self.spikes.append((self.index, norm))
        if len(self.spikes) >= 3:
            last = [round(g, 4) for _, g in self.spikes[-3:]]
            values = {"grad_norms": last, "running_median": median}
            return Finding(values, self.rule, {"norms": last, "within": self.cfg.within})
        return None


class _TrainEvalDivergence:
    rule = "train_eval_divergence"

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg.train_eval_divergence
        self.rewards: list[float] = []  # training rewards since the last eval
        self.points: list[tuple[float, float]] = []  # (mean training reward, eval value)

    def _metric(self, metrics: Mapping[str, Any]) -> str | None:
        if self.cfg.metric is not None:
            return self.cfg.metric if self.cfg.metric in metrics else None
        keys = sorted(k for k in metrics if EVAL_METRIC.match(k))
        return keys[0] if keys else None

    def evaluate(self, metrics: Mapping[str, Any]) -> object:
        reward = _finite(metrics, "reward_mean")
        if reward is not None:
            self.rewards.append(reward)
        key = self._metric(metrics)
        value = _finite(metrics, key) if key else None
        if value is None or not self.rewards:
            return MISSING
        self.points.append((sum(self.rewards) / len(self.rewards), value))
        self.rewards = []
        if len(self.points) < 3:
            return None
        (r0, e0), (r1, e1), (r2, e2) = self.points[-3:]
        d = self.cfg.min_drop
        if r2 > r1 > r0 and e1 < e0 - d and e2 < e1 - d:
            values = {"metric": key, "eval": [e0, e1, e2], "train_reward": [r0, r1, r2]}
            args = {"metric": key, "e0": e0, "e2": e2, "r0": r0, "r2": r2}
            return Finding(values, self.rule, args)
        return None


QUIET_RULES = (
    _EntropyCollapse,
    _LengthCollapse,
    _RatioExplosion,
    _KLSpike,
    _GradSpikes,
    _TrainEvalDivergence,
)
