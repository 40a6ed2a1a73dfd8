"""Shared fixtures for the reward tests."""

from __future__ import annotations

import os
import time

import pytest

from rlvr.rewards import symbolic


@pytest.fixture(scope="session", autouse=True)
def _stop_symbolic_worker():
    """The maths grader keeps one sandbox process; stop it when the session ends."""
    yield
    symbolic.shutdown()


def pid_alive(pid: int) -> bool:
    """True if a process with this pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(predicate, timeout_s: float = 5.0) -> bool:
    """Poll ``predicate`` until it is true or ``timeout_s`` passes; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.fixture
def canary(tmp_path, monkeypatch):
    """A path that hostile inputs try to create; tests assert it never appears."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "CANARY"
    yield path
    assert not path.exists() and not os.path.exists("CANARY")
