"""Telemetry: metric sinks, sampled completions, spike log, health gate and the HTML report.

``write_report`` is imported on first use, so a training process that only logs metrics does not
pay for importing matplotlib.
"""

from typing import Any

from rlvr.config.health import HealthConfig
from rlvr.telemetry.health import (
    HealthEvent,
    HealthGate,
    HealthStop,
    first_stop,
    read_health,
    write_health,
)
from rlvr.telemetry.keys import EVAL_PREFIX, METRIC_KEYS, eval_key
from rlvr.telemetry.samples import list_sample_steps, read_samples, write_samples
from rlvr.telemetry.sinks import MetricsLogger, read_metrics, truncate_metrics
from rlvr.telemetry.spikes import SpikeLog, prompt_hash

__all__ = [
    "EVAL_PREFIX",
    "METRIC_KEYS",
    "HealthConfig",
    "HealthEvent",
    "HealthGate",
    "HealthStop",
    "MetricsLogger",
    "SpikeLog",
    "eval_key",
    "first_stop",
    "list_sample_steps",
    "prompt_hash",
    "read_health",
    "read_metrics",
    "read_samples",
    "truncate_metrics",
    "write_health",
    "write_report",
    "write_samples",
]


def __getattr__(name: str) -> Any:
    if name == "write_report":
        from rlvr.telemetry.report import write_report

        return write_report
    raise AttributeError(f"module 'rlvr.telemetry' has no attribute {name!r}")
