"""Loading what a report needs from run directories: metrics, config, health, samples."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rlvr.telemetry.health import read_health
from rlvr.telemetry.keys import METRIC_KEYS
from rlvr.telemetry.samples import list_sample_steps, read_samples
from rlvr.telemetry.sinks import read_metrics

CONFIG_FILE = "config.yaml"
# What a verifier (the built-in graders) reports in its info; step metrics derive from them.
VERIFIER_INFO_KEYS = ("correct", "has_boxed", "has_answer", "high_reward_wrong_rate")


@dataclass
class RunData:
    """One run directory, loaded."""

    label: str
    path: Path
    metrics: list[dict[str, Any]]
    config: dict[str, Any] | None  # flattened dotted keys; None when there is no config.yaml
    health: dict[str, Any] | None
    samples: list[tuple[int, list[dict[str, Any]]]] = field(default_factory=list)
    status: dict[str, Any] | None = None  # status.json; None when there is none

    def has(self, key: str) -> bool:
        """True when at least one step logged a number for ``key``."""
        return bool(len(series(self.metrics, key)[0]))

    def logged_keys(self) -> set[str]:
        """Every metric key logged on some step."""
        return {k for record in self.metrics for k in record}

    def missing_contract_keys(self) -> list[str]:
        """Contract metric names this run never logged (see :mod:`rlvr.telemetry.keys`)."""
        logged = self.logged_keys()
        return [k for k in METRIC_KEYS if k not in logged]

    def expected_absent(self) -> dict[str, str]:
        """Contract keys this run's config says it never logs: key -> why (from config.yaml;
        {} without one)."""
        cfg = self.config or {}
        out: dict[str, str] = {}
        specs = cfg.get("reward.specs")
        names = [s.get("name", "") for s in specs if isinstance(s, dict)] if specs else []
        if names and all(":" in n for n in names):
            why = (
                f"the run's rewards are your own functions ({', '.join(names)}); they report "
                "these only in a RewardResult's info"
            )
            out.update({k: why for k in VERIFIER_INFO_KEYS})
        beta = cfg.get("algo.beta")
        if isinstance(beta, int | float) and beta == 0:
            out["kl"] = "algo.beta=0: no KL to a reference is measured"
        return out


def series(metrics: Sequence[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of the steps that logged ``key`` as a number (NaN / inf kept).

    Both arrays are float64 of shape ``[n]``; steps without the key are left out.
    """
    steps: list[float] = []
    values: list[float] = []
    for record in metrics:
        value = record.get(key)
        step = record.get("step")
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if isinstance(step, bool) or not isinstance(step, int | float):
            continue
        steps.append(float(step))
        values.append(float(value))
    return np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)


def rolling_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last ``window`` finite values at each position.

    ``values`` has shape ``[n]``; so does the result. Position ``i`` averages the finite entries
    of ``values[max(0, i - window + 1) : i + 1]`` (fewer at the start); NaN when there are none.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out = np.full(values.shape, np.nan)
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        chunk = chunk[np.isfinite(chunk)]
        if len(chunk):
            out[i] = chunk.mean()
    return out


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys: ``{"train": {"lr": 1}}`` -> ``{"train.lr": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_config(value, prefix=f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


# Marks a key that a config does not have (distinct from a key whose value is None).
ABSENT = object()


def config_diff(configs: Sequence[Mapping[str, Any] | None]) -> list[tuple[str, list[Any]]]:
    """Dotted keys whose value differs between flattened configs (or is absent in some).

    Returns ``(key, values)`` rows sorted by key, ``values`` holding one entry per config and
    :data:`ABSENT` where that config lacks the key. A missing config counts as lacking every key.
    """
    present = [c if c is not None else {} for c in configs]
    keys = sorted({k for c in present for k in c})
    rows = []
    for key in keys:
        values = [c.get(key, ABSENT) for c in present]
        first = values[0]
        if any(not _same(first, v) for v in values[1:]):
            rows.append((key, values))
    return rows


def _same(a: Any, b: Any) -> bool:
    if a is ABSENT or b is ABSENT:
        return a is b
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b) and type(a) is type(b)


def load_config(run_dir: Path) -> dict[str, Any] | None:
    """The flattened ``config.yaml`` of a run, or None when the file does not exist."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.exists():
        return None
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return flatten_config(data)


def load_run(run_dir: Path, label: str, *, sample_steps: int = 2) -> RunData:
    """Load one run directory; ``sample_steps`` sample files are kept (first and last)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory not found: {run_dir}")
    steps = list_sample_steps(run_dir)
    chosen = sorted({steps[0], steps[-1]})[:sample_steps] if steps else []
    return RunData(
        label=label,
        path=run_dir,
        metrics=read_metrics(run_dir),
        config=load_config(run_dir),
        health=read_health(run_dir),
        samples=[(s, read_samples(run_dir, s)) for s in chosen],
        status=read_status(run_dir),
    )


STATUS_FILE = "status.json"  # written by rlvr.training.loop.write_status


def read_status(run_dir: Path) -> dict[str, Any] | None:
    """A run's ``status.json`` (how it ended, or "running"); None when it has none or it is not
    a JSON object."""
    path = Path(run_dir) / STATUS_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run_state(status: Mapping[str, Any] | None) -> str:
    """How a run ended, in words, from its status.json."""
    if status is None:
        return "unknown (no status.json)"
    state, step = status.get("state"), status.get("step")
    after = f" after step {step}" if step is not None else ""
    if state == "finished":
        return "finished"
    if state == "running":
        return (
            "not finished: status.json says running (still running, or killed without a "
            "word; rlvr train --resume RUN_DIR continues from its last checkpoint)"
        )
    if state == "failed":
        return f"failed{after}: {status.get('error', 'no error recorded')}"
    if state == "preempted":
        return f"preempted ({status.get('signal', 'a stop signal')}){after}: resume it"
    if state == "interrupted":
        return f"interrupted{after}"
    if state == "stopped_by_health":
        return f"stopped by the health gate ({status.get('rule', 'a rule')})"
    return f"{state}{after}"


def run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Display names: each directory's name, made unique with ``#2``, ``#3`` on repeats."""
    labels: list[str] = []
    counts: dict[str, int] = {}
    for run_dir in run_dirs:
        name = Path(run_dir).resolve().name or str(run_dir)
        counts[name] = counts.get(name, 0) + 1
        labels.append(name if counts[name] == 1 else f"{name}#{counts[name]}")
    return labels
