"""Environment calls under a time limit, so one episode's environment cannot stall the batch.

Each call runs in its own daemon thread; the caller waits at most ``timeout_s``. A call past
it is abandoned and reported as timed out: its episode fails, the others go on. A thread cannot
be killed, so an environment spinning in Python keeps running until it returns (it holds no
lock of ours and its result is dropped); code that may never return belongs in a killable
process, as the built-in Python tool runs its snippets (rlvr.envs.python_tool).
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Outcome:
    ok: bool
    value: Any = None
    error: str = ""
    timed_out: bool = False


class _Call:
    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn, self.outcome, self.done = fn, None, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="rlvr-env-call")

    def _run(self) -> None:
        try:
            self.outcome = Outcome(True, self.fn())
        except BaseException as exc:  # noqa: BLE001 - everything marks the episode
            tb = traceback.format_exc(limit=-3)
            self.outcome = Outcome(False, error=f"{type(exc).__name__}: {exc}\n{tb}"[:4000])
        self.done.set()


def call_all(fns: list[Callable[[], Any]], timeout_s: float) -> list[Outcome]:
    """Run ``fns`` concurrently, each for at most ``timeout_s`` seconds; one outcome per call."""
    calls = [_Call(fn) for fn in fns]
    for c in calls:
        c.thread.start()
    deadline = time.monotonic() + timeout_s
    out = []
    for c in calls:
        if c.done.wait(max(0.0, deadline - time.monotonic())) and c.outcome is not None:
            out.append(c.outcome)
        else:
            out.append(Outcome(False, error=f"timed out after {timeout_s} s", timed_out=True))
    return out
