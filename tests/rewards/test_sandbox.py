"""The sandbox process: results, errors, hard time limits, memory cap, no orphans."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
from reward_test_utils import pid_alive, wait_until

from rlvr.rewards.pool import SandboxPool
from rlvr.rewards.sandbox import (
    SandboxError,
    SandboxTimeout,
    SandboxWorker,
    WorkerDied,
    resolve_target,
)


@pytest.fixture
def worker():
    w = SandboxWorker()
    yield w
    w.close()


def test_call_returns_value_and_reports_errors(worker) -> None:
    assert worker.call("math:gcd", (84, 36), timeout_s=10) == 12  # 84 = 2^2*3*7, 36 = 2^2*3^2
    with pytest.raises(SandboxError, match="ValueError") as info:
        worker.call("math:sqrt", (-1.0,), timeout_s=10)
    assert "Traceback" in info.value.remote_traceback
    # the worker survives a raised error
    assert worker.call("operator:add", (2, 3), timeout_s=10) == 5


def test_timeout_kills_and_replaces_the_process(worker) -> None:
    worker.wait_ready()
    first_pid = worker.pid
    start = time.monotonic()
    with pytest.raises(SandboxTimeout):
        worker.call("time:sleep", (60,), timeout_s=0.5)
    assert time.monotonic() - start < 0.5 + 1.0  # the limit plus kill-and-respawn slack
    assert wait_until(lambda: not pid_alive(first_pid))
    assert worker.call("operator:mul", (6, 7), timeout_s=10) == 42
    assert worker.pid != first_pid


def test_crash_is_reported_and_recovered(worker) -> None:
    with pytest.raises(WorkerDied, match="exit code 3"):
        worker.call("os:_exit", (3,), timeout_s=10)
    assert worker.call("operator:sub", (10, 4), timeout_s=10) == 6


def test_memory_cap_turns_a_huge_allocation_into_an_error() -> None:
    worker = SandboxWorker(memory_limit_mb=512)
    try:
        with pytest.raises(SandboxError, match="MemoryError"):
            worker.call("builtins:bytearray", (2 * 1024**3,), timeout_s=10)  # 2 GiB > 512 MiB
        assert worker.call("builtins:len", (bytearray(10),), timeout_s=10) == 10
    finally:
        worker.close()


def test_close_leaves_no_process(worker) -> None:
    worker.wait_ready()
    pid = worker.pid
    worker.close()
    assert wait_until(lambda: not pid_alive(pid))


def test_child_dies_with_its_parent(tmp_path) -> None:
    """Even a child busy in a call goes when the parent is killed without cleanup."""
    script = textwrap.dedent(
        """
        import os, sys
        from rlvr.rewards.sandbox import SandboxWorker
        w = SandboxWorker()
        w.wait_ready()
        print(w.pid, flush=True)
        w.submit("time:sleep", (60,))
        os._exit(0)  # no atexit, no close(): an abrupt death
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    child = int(out.stdout.split()[0])
    assert wait_until(lambda: not pid_alive(child), timeout_s=5.0)


def test_resolve_target_errors() -> None:
    assert resolve_target("os.path:join") is __import__("os").path.join
    with pytest.raises(ValueError, match="package.module:function"):
        resolve_target("os.path.join")
    with pytest.raises(ModuleNotFoundError):
        resolve_target("no_such_module_xyz:f")


def test_pool_contains_one_hang_within_the_timeout() -> None:
    with SandboxPool(2) as pool:
        for worker in pool.workers:
            worker.wait_ready()
        calls = [("operator:add", (i, i), {}) for i in range(6)]
        calls[2] = ("time:sleep", (60,), {})
        start = time.monotonic()
        outcomes = pool.map(calls, timeout_s=1.0)
        elapsed = time.monotonic() - start
    assert elapsed < 1.0 + 1.0
    assert [o.ok for o in outcomes] == [True, True, False, True, True, True]
    assert outcomes[2].timed_out
    assert [o.value for o in outcomes if o.ok] == [0, 2, 6, 8, 10]  # i + i for i in 0, 1, 3, 4, 5


def test_pool_stops_early_when_failures_exceed_the_limit() -> None:
    with SandboxPool(1) as pool:
        calls = [("math:sqrt", (-1.0,), {})] * 5 + [("operator:add", (1, 1), {})]
        outcomes = pool.map(calls, timeout_s=5.0, max_failures=2)
    # the third failure exceeds max_failures=2; the remaining calls are not run
    assert [o.ok for o in outcomes] == [False] * 6
    assert "not run" in outcomes[-1].error
    assert "ValueError" in outcomes[0].error and "Traceback" in outcomes[0].traceback
