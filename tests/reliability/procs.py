"""Watching a child process from outside: has it exited, and wait for a condition while it runs."""

from __future__ import annotations

import time
from collections.abc import Callable


def exited(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie waiting to be reaped counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def wait_for(condition: Callable[[], object], pid: int, timeout_s: float = 120.0) -> bool:
    """Poll every 2 ms until ``condition()`` is truthy; False if the child exits first.

    Raises TimeoutError after ``timeout_s`` (a run that neither gets there nor ends is a bug).
    """
    deadline = time.monotonic() + timeout_s
    while not condition():
        if exited(pid):
            return bool(condition())
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} did not reach the condition in {timeout_s} s")
        time.sleep(0.002)
    return True


def sleep_while_running(seconds: float, pid: int) -> bool:
    """Sleep up to ``seconds``; False (early) if the child exits meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if exited(pid):
            return False
        time.sleep(0.002)
    return not exited(pid)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
