"""The line protocol between the benchmark runner and its two workers (standard library only).

The runner keeps both workers alive and lets them take turns: it writes one JSON command per line
to a worker's stdin (``{"cmd": "run", "steps": k}`` or ``{"cmd": "stop"}``) and reads events the
worker prints on stdout as ``@@bench {json}`` lines. Everything else a worker prints (progress,
library logs) is ordinary output that the runner copies to the worker's log file.

A worker blocks in :class:`Gate` between blocks of steps, so only one side uses the CPU at a time;
the time it spends blocked is excluded from its step times.
"""

from __future__ import annotations

import json
import sys
import time
from typing import IO, Any

MARKER = "@@bench "


def encode_event(kind: str, **data: Any) -> str:
    """One protocol line (without the newline) for an event of ``kind`` with JSON-able ``data``."""
    if not kind or not kind.isidentifier():
        raise ValueError(f"event kind must be an identifier, got {kind!r}")
    return MARKER + json.dumps({"event": kind, **data}, sort_keys=True)


def parse_event(line: str) -> dict | None:
    """The event dict of a protocol line, or None for any other output line."""
    if not line.startswith(MARKER):
        return None
    try:
        event = json.loads(line[len(MARKER) :])
    except json.JSONDecodeError as exc:
        raise ValueError(f"malformed benchmark event line {line[:200]!r}: {exc}") from None
    if not isinstance(event, dict) or "event" not in event:
        raise ValueError(f"benchmark event line without an 'event' field: {line[:200]!r}")
    return event


def parse_command(line: str) -> tuple[str, int]:
    """``("run", k)`` or ``("stop", 0)`` from one command line sent by the runner."""
    try:
        cmd = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"malformed benchmark command {line[:200]!r}: {exc}") from None
    kind = cmd.get("cmd") if isinstance(cmd, dict) else None
    if kind == "stop":
        return "stop", 0
    if kind == "run":
        steps = cmd.get("steps")
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"'run' command needs steps >= 1, got {steps!r}")
        return "run", steps
    raise ValueError(f"unknown benchmark command {kind!r}; known: run, stop")


class Gate:
    """Lets a worker run steps only in the blocks the runner grants, and times each step.

    Call :meth:`start` once before the first step (it reports ``ready`` and waits for the first
    block), then :meth:`step_done` after every step. A step's wall time runs from the end of the
    previous step (or from the moment the worker was let go) to the end of this one, so the work a
    training loop does between two steps (logging, checks) is counted and waiting is not.
    """

    def __init__(self, stdin: IO[str] | None = None, stdout: IO[str] | None = None):
        self._in = stdin if stdin is not None else sys.stdin
        self._out = stdout if stdout is not None else sys.stdout
        self._left = 0
        self._t0 = 0.0
        self.stopped = False
        self.steps_done = 0

    def emit(self, kind: str, **data: Any) -> None:
        self._out.write(encode_event(kind, **data) + "\n")
        self._out.flush()

    def _wait(self) -> None:
        line = self._in.readline()
        if not line:  # the runner went away: behave as if told to stop
            self.stopped = True
            return
        kind, steps = parse_command(line)
        self.stopped = kind == "stop"
        self._left = steps
        self._t0 = time.perf_counter()

    def start(self, **ready_info: Any) -> bool:
        """Report readiness and wait for the first block; False when told to stop instead."""
        self.emit("ready", **ready_info)
        self._wait()
        return not self.stopped

    def step_done(self, record: dict) -> bool:
        """Report one finished step; returns False when the worker must stop (no more steps)."""
        now = time.perf_counter()
        self.steps_done += 1
        self.emit("step", wall_s=now - self._t0, **record)
        self._t0 = now
        self._left -= 1
        if self._left <= 0:
            self.emit("paused", steps_done=self.steps_done)
            self._wait()
        return not self.stopped
