"""Clean shutdown: Ctrl-C (SIGINT) during a rollout or an update ends the run with status.json
saying "interrupted" at the last finished step, exit code 130 from ``rlvr train``, its checkpoints
intact, and no child process left behind (reward sandbox workers, the maths checker).

In process, the signal is real (``os.kill`` of this process from inside the phase) and the
children are those of this very process, so a worker the run forgot to close would still be
here (nothing kills it on the parent's death). From outside, the forked run gets SIGINT on its
whole process group, as a terminal's Ctrl-C would send it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from reliability.figures import add
from reliability.procs import alive, wait_for
from reliability.runs import read_status, tiny_overrides
from reliability.shutdown_hooks import interrupt_in
from rlvr.checkpoint.full import latest_checkpoint, read_state
from rlvr.cli.main import main as cli_main
from rlvr.rewards import symbolic

# A maths reward (weight 0) starts the maths checker's child; a user reward starts the pool.
REWARDS = "reward.specs=[{name: math, weight: 0.0}, {name: 'toy_rewards:count_sevens'}]"


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def shutdown_argv(model_dir: Path, out: Path, name: str, *extra: str) -> list[str]:
    return ["train", *tiny_overrides(model_dir, out, name, REWARDS, "train.max_steps=4", *extra)]


@pytest.mark.parametrize("phase", ["rollout", "update"])
def test_ctrl_c_stops_the_run_cleanly(
    phase, tiny_model_dir, tmp_path, capsys, restore_threads, sigint_raises
) -> None:
    symbolic.shutdown()  # the run must start its own maths checker, to be seen closing it
    before = children()
    run_dir = tmp_path / "interrupted"
    during: set[int] = set()

    def ctrl_c() -> None:
        during.update(children() - before)
        os.kill(os.getpid(), signal.SIGINT)

    remove = interrupt_in(phase, run_dir, ctrl_c)
    try:
        code = cli_main(
            shutdown_argv(tiny_model_dir, tmp_path, "interrupted", "train.save_every=1")
        )
    finally:
        remove()
    assert code == 130
    assert "interrupted" in capsys.readouterr().err
    status = read_status(run_dir)
    assert status["state"] == "interrupted" and status["step"] == 1  # inside step 2
    # The run had its children when Ctrl-C came: two reward workers and the maths checker.
    assert len(during) >= 3, during
    assert not (children() - before), "child processes left behind"
    assert not [pid for pid in during if alive(pid)]
    # The checkpoint of the last finished step is complete and loads.
    latest = latest_checkpoint(run_dir)
    assert latest is not None and latest.step == 1
    read_state(latest.path)
    add("clean_shutdown", interrupts=1, child_processes_left=0)


def test_ctrl_c_from_a_terminal_reaches_the_process_group(
    fork_server, tiny_model_dir, tmp_path
) -> None:
    """SIGINT to the whole group, as a terminal sends it: the sandbox children ignore it (their
    parent closes them); the run exits with 130 and leaves no process of its group behind."""
    run_dir = tmp_path / "terminal"
    env = {"RLVR_TEST_PAUSE_IN": "rollout", "RLVR_TEST_RUN_DIR": str(run_dir)}
    argv = shutdown_argv(tiny_model_dir, tmp_path, "terminal", "train.save_every=1")
    pid = fork_server.run(
        argv,
        tmp_path / "log.txt",
        env=env,
        hooks="reliability.shutdown_hooks:install",
        new_group=True,
    )
    marker = tmp_path / "in_rollout"
    assert wait_for(marker.exists, pid), (tmp_path / "log.txt").read_text()[-3000:]
    group = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == pid]
    assert len(group) >= 4  # the run, two reward workers, the maths checker
    os.killpg(pid, signal.SIGINT)
    assert fork_server.wait(pid) == 130
    assert read_status(run_dir)["state"] == "interrupted"
    deadline = time.monotonic() + 10
    while any(alive(p.pid) for p in group) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p.pid for p in group if alive(p.pid)], "processes of the run's group left behind"
    add("clean_shutdown", interrupts=1, child_processes_left=0)


def test_ctrl_c_writes_a_final_checkpoint_or_says_why_not(
    tiny_model_dir, tmp_path, capsys, restore_threads, sigint_raises
) -> None:
    """Issue 9: Ctrl-C "writes a final checkpoint (or states why not)". With train.save_every=3
    and Ctrl-C inside step 5, step 4 would be lost silently: either a checkpoint of step 4 is
    written on the way out, or the run says (status.json or the terminal) that it was not."""
    run_dir = tmp_path / "lossy"
    fired: list[bool] = []

    def ctrl_c() -> None:
        fired.append(True)
        os.kill(os.getpid(), signal.SIGINT)

    remove = interrupt_in("update", run_dir, ctrl_c, after_step=4)
    try:
        argv = shutdown_argv(
            tiny_model_dir, tmp_path, "lossy", "train.save_every=3", "train.max_steps=6"
        )
        code = cli_main(argv)
    finally:
        remove()
    assert code == 130 and fired
    err = capsys.readouterr().err
    status = read_status(run_dir)
    assert status["state"] == "interrupted" and status["step"] == 4
    latest = latest_checkpoint(run_dir)
    said_why = "checkpoint" in (str(status) + err).lower()
    assert (latest is not None and latest.step == 4) or said_why, (status, err, latest)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_the_ctrl_c_tests_pass_when_started_with_sigint_ignored(tmp_path) -> None:
    """``make test`` from a background job or ``nohup`` starts pytest with SIGINT ignored; the
    Ctrl-C tests must install the handling they rely on (they failed there before)."""
    import subprocess
    import sys

    here = Path(__file__)
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         f"{here}::test_ctrl_c_stops_the_run_cleanly", f"{here}::test_ctrl_c_from_a_terminal_"
         "reaches_the_process_group", f"--basetemp={tmp_path / 'inner'}"],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=here.parents[2],
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "3 passed" in res.stdout
