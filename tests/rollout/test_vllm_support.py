"""The vLLM tests' ``rollout_server`` helper itself, without vLLM: a stand-in process group."""

from __future__ import annotations

import os
import subprocess
import time

import vllm_support
from vllm_support import rollout_server

from rlvr.rollout.server_auth import TOKEN_ENV


def _stand_in(monkeypatch, script: str) -> list[subprocess.Popen]:
    """``rollout_server`` starts ``sh -c script`` instead of `rlvr rollout-server`."""
    started: list[subprocess.Popen] = []
    popen = subprocess.Popen

    def fake(cmd, **kw):
        started.append(popen(["sh", "-c", script], **kw))
        return started[-1]

    monkeypatch.setattr(vllm_support.subprocess, "Popen", fake)
    monkeypatch.setattr("rlvr.rollout.server_launch.wait_healthy", lambda *a, **k: None)
    return started


def test_the_token_a_server_put_in_the_environment_goes_with_it(monkeypatch, tmp_path):
    """Each server's token is set in this process's environment for its trainers while it runs,
    and removed with it: a later test's trainer does not send a dead server's token."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    started = _stand_in(monkeypatch, "exec sleep 30")
    with rollout_server(tmp_path, [], tmp_path / "log") as url:
        assert os.environ.get(TOKEN_ENV)
        assert url.startswith("http://127.0.0.1:")
    assert TOKEN_ENV not in os.environ
    assert started[0].returncode is not None  # SIGTERM ended it


def test_a_group_that_ignores_sigterm_is_killed(monkeypatch, tmp_path):
    """vLLM's engine process outliving its API server: SIGKILL for the whole group."""
    monkeypatch.setattr(vllm_support.subprocess.Popen, "wait", _short_wait(subprocess.Popen.wait))
    pidfile = tmp_path / "child"
    started = _stand_in(
        monkeypatch, f"sh -c 'trap \"\" TERM; echo $$ > {pidfile}; sleep 60' & trap '' TERM; wait"
    )
    with rollout_server(tmp_path, [], tmp_path / "log"):
        deadline = time.monotonic() + 10
        while not (pidfile.exists() and pidfile.read_text().strip()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    child = int(pidfile.read_text())
    assert started[0].returncode is not None
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{child}") and _state(child) != "Z":
        assert time.monotonic() < deadline, "the group's other process survived"
        time.sleep(0.05)


def _short_wait(wait):
    """``proc.wait(60)`` after SIGTERM waits 1 s here."""

    def short(self, timeout=None):
        return wait(self, None if timeout is None else min(timeout, 1))

    return short


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except OSError:
        return "gone"
