"""The health gate: checks each step's metrics against early smoke-test criteria.

Usage in a training loop::

    gate = HealthGate(cfg.health)
    events = gate.check(step, metrics)          # every step; returns what fired this step
    stop = first_stop(events)
    write_health(run_dir, gate.events, stopped_by=stop)   # when events is non-empty
    if stop is not None:
        raise HealthStop(stop)                  # the trainer catches it and exits non-zero

Semantics (the same for every rule):

- Steps with ``step < warmup_steps`` are ignored; windows start counting after warm-up. A rule
  whose metric is no early noise (``truncation``: set by the token limit; ``logprob_mismatch``:
  a gap above its thresholds is a bug) says
  ``skips_warmup`` and is checked from the first step.
- A rule whose metric is missing (or NaN) on a step leaves its state unchanged that step; the
  ``has_boxed`` rule, for example, never fires on a task that does not log ``has_boxed``.
- A rule that cannot apply to the run is not checked at all: ``has_boxed`` only where the
  prompts ask for a boxed answer (``rlvr.data.templates.asks_for_boxed``).
- "Stuck" rules fire when their condition has held on ``window`` consecutive checked steps.
- Rules are edge-triggered: a rule fires once when its condition starts to hold and again only
  after the condition has cleared on some step and come back. A warning that holds for 100 steps
  is one event, not 100.
- Window state lives in memory: a resumed run starts its windows afresh.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from rlvr.config.health import HealthConfig
from rlvr.jsonio import append_line, atomic_write_text, dumps_line, loads_strict, read_jsonl
from rlvr.telemetry.health_quiet import QUIET_RULES
from rlvr.telemetry.health_rules import MISSING, RULES, Finding
from rlvr.telemetry.playbook import ADVICE

ALL_RULES = RULES + QUIET_RULES
RULE_NAMES: tuple[str, ...] = tuple(r.rule for r in ALL_RULES)

HEALTH_FILE = "health.json"
HEALTH_EVENTS_FILE = "health_events.jsonl"


@dataclass(frozen=True)
class HealthEvent:
    """One rule firing: which rule, what to do, at which step, the numbers seen and advice."""

    rule: str
    action: str
    step: int
    values: dict[str, Any] = field(default_factory=dict)
    advice: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return {
            "rule": self.rule,
            "action": self.action,
            "step": self.step,
            "values": dict(self.values),
            "advice": self.advice,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HealthEvent:
        """Inverse of :meth:`to_dict`."""
        return cls(
            rule=str(data["rule"]),
            action=str(data["action"]),
            step=int(data["step"]),
            values=dict(data.get("values", {})),
            advice=str(data.get("advice", "")),
        )


class HealthStop(Exception):
    """Raised by the trainer when a ``stop`` rule fires; carries the event."""

    def __init__(self, event: HealthEvent) -> None:
        self.event = event
        self.checkpoint = "nothing"  # the trainer's line on what it kept (a checkpoint)
        super().__init__(
            f"health gate stopped the run at step {event.step}: rule {event.rule!r} "
            f"({_format_values(event.values)}). {event.advice}"
        )


def _format_values(values: Mapping[str, Any]) -> str:
    parts = []
    for key, value in values.items():
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        parts.append(f"{key}={shown}")
    return ", ".join(parts)


def first_stop(events: Iterable[HealthEvent]) -> HealthEvent | None:
    """The first event whose action is ``stop``, or None."""
    return next((e for e in events if e.action == "stop"), None)


class HealthGate:
    """Stateful checker; call :meth:`check` once per step with that step's metrics dict."""

    def __init__(
        self, cfg: HealthConfig | None = None, *, not_applicable: Iterable[str] = ()
    ) -> None:
        """``not_applicable``: rules that cannot apply to this run and are never checked (the
        trainer names ``has_boxed`` when no prompt asks for a boxed answer)."""
        self.cfg = cfg if cfg is not None else HealthConfig()
        skip = set(not_applicable)
        unknown = skip - set(RULE_NAMES)
        if unknown:
            raise ValueError(f"unknown health rules {sorted(unknown)}; known: {RULE_NAMES}")
        self._checks = [rule(self.cfg) for rule in ALL_RULES if rule.rule not in skip]
        self._active: set[str] = set()
        self.events: list[HealthEvent] = []

    def check(self, step: int, metrics: Mapping[str, Any]) -> list[HealthEvent]:
        """Events that fire at ``step`` (during warm-up only from rules that skip it); also kept
        in ``self.events``."""
        warming_up = step < self.cfg.warmup_steps
        fired: list[HealthEvent] = []
        for check in self._checks:
            rule_cfg = getattr(self.cfg, check.rule)
            if not rule_cfg.enabled or (warming_up and not getattr(check, "skips_warmup", False)):
                continue
            outcome = check.evaluate(metrics)
            if outcome is MISSING:
                continue
            if outcome is None:
                self._active.discard(check.rule)
                continue
            if check.rule in self._active:
                continue  # still holding since it fired: one event per episode
            self._active.add(check.rule)
            outcome = cast(Finding, outcome)
            advice = ADVICE[outcome.advice_key].format(**outcome.advice_args)
            event = HealthEvent(check.rule, rule_cfg.action, int(step), outcome.values, advice)
            fired.append(event)
        self.events.extend(fired)
        return fired


# ---------------------------------------------------------------------------------------------
# Files.


def _event_key(event: Mapping[str, Any]) -> tuple[int, str]:
    return int(event["step"]), str(event["rule"])


def write_health(
    run_dir: Path, events: Iterable[HealthEvent], stopped_by: HealthEvent | None = None
) -> Path:
    """Record health events in ``run_dir``; returns the path of ``health.json``.

    ``health_events.jsonl`` gets one appended line per event not recorded before (an event is
    identified by its step and rule, so passing all events so far on every call, or only the new
    ones, both work). ``health.json`` is rewritten atomically with the status ("ok", "warned" or
    "stopped"), the stopping event (rule, values, advice) and every event recorded so far.
    """
    run_dir = Path(run_dir)
    jsonl = run_dir / HEALTH_EVENTS_FILE
    recorded = read_jsonl(jsonl)
    seen = {_event_key(e) for e in recorded}
    candidates = list(events) + ([stopped_by] if stopped_by is not None else [])
    for event in candidates:
        as_dict = event.to_dict()
        if _event_key(as_dict) in seen:
            continue
        append_line(jsonl, as_dict)
        recorded.append(loads_strict(dumps_line(as_dict)))
        seen.add(_event_key(as_dict))
    recorded.sort(key=lambda e: int(e["step"]))  # stable: same-step events keep rule order
    status = "stopped" if stopped_by is not None else ("warned" if recorded else "ok")
    summary = {
        "status": status,
        "stopped_by": stopped_by.to_dict() if stopped_by is not None else None,
        "events": recorded,
    }
    path = run_dir / HEALTH_FILE
    atomic_write_text(path, dumps_line(summary))
    return path


def read_health(run_dir: Path) -> dict[str, Any] | None:
    """``health.json`` of a run (or a summary built from ``health_events.jsonl``), None if neither."""
    run_dir = Path(run_dir)
    path = run_dir / HEALTH_FILE
    if path.exists():
        data = loads_strict(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object")
        data.setdefault("events", [])
        data.setdefault("stopped_by", None)
        return data
    events = read_jsonl(run_dir / HEALTH_EVENTS_FILE)
    if not events and not (run_dir / HEALTH_EVENTS_FILE).exists():
        return None
    return {"status": "warned" if events else "ok", "stopped_by": None, "events": events}
