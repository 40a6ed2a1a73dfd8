"""Fixtures of the reliability suite: a canary path, the maths checker's child, the figures file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reliability.figures import write_if_requested
from rlvr.rewards import symbolic


def pytest_sessionfinish(session, exitstatus) -> None:
    path = write_if_requested()
    if path is not None:
        print(f"\nreliability figures written to {path}")


@pytest.fixture(scope="session", autouse=True)
def _stop_symbolic_worker():
    """The maths grader keeps one sandbox process; stop it when the session ends."""
    yield
    symbolic.shutdown()


@pytest.fixture
def canary(tmp_path: Path, monkeypatch) -> Path:
    """A path hostile inputs try to create (absolute, and relative to the working directory).

    The maths checker's child is restarted so that it too runs in this working directory.
    """
    monkeypatch.chdir(tmp_path)
    symbolic.shutdown()
    path = tmp_path / "CANARY"
    yield path
    symbolic.shutdown()
    assert not path.exists() and not os.path.exists("CANARY")


@pytest.fixture
def sigint_raises():
    """Ctrl-C must raise KeyboardInterrupt here, even when pytest itself was started with SIGINT
    ignored (a background job or ``nohup``: the shell makes the child ignore it)."""
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture
def restore_threads():
    """Runs set ``train.threads``, which changes torch's thread count for this whole process."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def fork_server():
    """One pre-imported process that forks the runs the process-fault tests kill."""
    from reliability.forkserver import ForkServer

    with ForkServer() as server:
        yield server
