"""Shared fixtures for the reward tests."""

from __future__ import annotations

import os

import pytest

from rlvr.rewards import symbolic


@pytest.fixture(scope="session", autouse=True)
def _stop_symbolic_worker():
    """The maths grader keeps one sandbox process; stop it when the session ends."""
    yield
    symbolic.shutdown()


@pytest.fixture
def canary(tmp_path, monkeypatch):
    """A path that hostile inputs try to create; tests assert it never appears."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "CANARY"
    yield path
    assert not path.exists() and not os.path.exists("CANARY")
