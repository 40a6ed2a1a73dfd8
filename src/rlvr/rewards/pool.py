"""Run many calls over a few sandbox workers, each call under its own time limit.

A call that overruns gets its worker killed and replaced while the other workers keep
going, so one hanging sample costs about ``timeout_s`` of wall time, not a stalled step.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

from rlvr.rewards.sandbox import SandboxWorker, WorkerDied

__all__ = ["CallOutcome", "SandboxPool"]


@dataclass
class CallOutcome:
    """Result of one call: ``ok`` with ``value``, or an ``error`` line and its traceback."""

    ok: bool
    value: Any = None
    error: str = ""
    traceback: str = ""
    timed_out: bool = False


class SandboxPool:
    """``size`` sandbox workers started at construction; ``close()`` kills them."""

    def __init__(self, size: int = 2, **worker_kwargs: Any) -> None:
        if size < 1:
            raise ValueError(f"pool size must be >= 1, got {size}")
        self.workers = [SandboxWorker(**worker_kwargs) for _ in range(size)]
        for worker in self.workers:
            worker.start()

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def map(
        self,
        calls: list[tuple[str, tuple, dict]],
        *,
        timeout_s: float,
        max_failures: int | None = None,
    ) -> list[CallOutcome]:
        """Run ``(target, args, kwargs)`` calls; one outcome per call, in order.

        Stops early once more than ``max_failures`` calls have failed; calls not yet run
        then get an outcome with error "not run: too many failures in this batch".
        Raises WorkerDied if a worker cannot start at all.
        """
        outcomes: list[CallOutcome | None] = [None] * len(calls)
        queue = deque(range(len(calls)))
        running: dict[SandboxWorker, tuple[int, float]] = {}
        failures = 0

        def fail(index: int, outcome: CallOutcome) -> None:
            nonlocal failures
            outcomes[index] = outcome
            failures += 1

        for worker in self.workers:
            worker.start()
        while queue or running:
            if max_failures is not None and failures > max_failures:
                break
            for worker in self.workers:
                if queue and worker.ready and worker not in running:
                    if not worker.alive:  # died while idle: replace it, lose no call
                        worker.restart()
                        continue
                    index = queue.popleft()
                    try:
                        worker.submit(*calls[index])
                    except WorkerDied as exc:
                        fail(index, CallOutcome(False, error=str(exc)))
                        worker.restart()
                        continue
                    running[worker] = (index, time.monotonic() + timeout_s)
            pending = [w for w in self.workers if w in running or not w.ready]
            if not pending:
                continue
            now = time.monotonic()
            deadlines = [running[w][1] if w in running else w.startup_deadline for w in pending]
            for conn in wait([w.connection for w in pending], max(0.0, min(deadlines) - now)):
                worker = next(w for w in pending if w.connection is conn)
                try:
                    msg = worker.read()
                except WorkerDied as exc:
                    if worker in running:
                        fail(running.pop(worker)[0], CallOutcome(False, error=str(exc)))
                        worker.restart()
                        continue
                    raise
                if msg[0] == "ok":
                    outcomes[running.pop(worker)[0]] = CallOutcome(True, value=msg[2])
                elif msg[0] == "err":
                    _, _, type_name, message, tb = msg
                    fail(
                        running.pop(worker)[0],
                        CallOutcome(False, None, f"{type_name}: {message}", tb),
                    )
            now = time.monotonic()
            for worker in pending:
                if worker in running and now >= running[worker][1]:
                    error = f"timed out after {timeout_s} s (worker killed and restarted)"
                    fail(running.pop(worker)[0], CallOutcome(False, error=error, timed_out=True))
                    worker.restart()
                elif worker not in running and not worker.ready and now >= worker.startup_deadline:
                    worker.kill()
                    raise WorkerDied(
                        f"sandbox worker did not start within {worker.startup_timeout_s} s"
                    )
        for worker in list(running):  # stopped early: results of calls in flight are not wanted
            worker.restart()
        skipped = CallOutcome(False, error="not run: too many failures in this batch")
        return [outcome if outcome is not None else skipped for outcome in outcomes]
