"""Preemption (issue 51): SIGTERM or SIGUSR1, as Slurm and Kubernetes stop a job, during the
rollout or the update of a real ``rlvr train`` process: the run writes a complete checkpoint of
its last finished step, says "preempted" (signal, step) in status.json, exits with 4 and leaves
no process or temporary folder behind; the same command line with ``--resume auto`` then ends
with the final weights and every per-step metric (timings aside) equal to an uninterrupted run's.

No periodic checkpoint is asked for (``train.save_every=0``), so the only checkpoint the resume
can use is the one written on the signal: a step lost would show as a missing or extra metrics
line and as different weights.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest
import torch

from reliability.figures import add
from reliability.procs import alive, wait_for
from reliability.runs import assert_equal_to_reference, read_status, tiny_overrides
from rlvr.checkpoint.full import TMP_PREFIX, checkpoints_dir, latest_checkpoint, read_state
from rlvr.telemetry.sinks import read_metrics

MAX_STEPS = 4
# A maths reward (weight 0) starts the maths checker's child; a user reward starts the pool.
REWARDS = "reward.specs=[{name: math, weight: 0.0}, {name: 'toy_rewards:count_sevens'}]"


def argv(model_dir: Path, out: Path, name: str, *extra: str) -> list[str]:
    return [
        "train",
        *tiny_overrides(model_dir, out, name, REWARDS, f"train.max_steps={MAX_STEPS}"),
        "train.save_every=0",
        *extra,
    ]


@pytest.fixture(scope="module")
def reference(fork_server, tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference")
    pid = fork_server.run(argv(tiny_model_dir, out, "ref"), out / "log.txt")
    assert fork_server.wait(pid) == 0, (out / "log.txt").read_text()[-3000:]
    return out / "ref"


def group_of(pid: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pid:
                out.append(p.pid)
        except ProcessLookupError:
            pass
    return out


@pytest.mark.parametrize(
    ("phase", "sig", "to_group"),
    [
        # scancel, Kubernetes: every process of the job; sbatch --signal=USR1@120: the warning
        pytest.param("rollout", signal.SIGTERM, True, id="rollout-SIGTERM-group"),
        pytest.param("update", signal.SIGUSR1, False, id="update-SIGUSR1-run"),
        pytest.param("rollout", signal.SIGUSR1, False, id="rollout-SIGUSR1-run"),
        pytest.param("update", signal.SIGTERM, True, id="update-SIGTERM-group"),
    ],
)
def test_a_stop_signal_checkpoints_and_resume_auto_loses_nothing(
    phase, sig, to_group, fork_server, tiny_model_dir, tmp_path, reference
) -> None:
    name = "preempted"
    run_dir = tmp_path / name
    log = tmp_path / "log.txt"
    env = {"RLVR_TEST_PAUSE_IN": phase, "RLVR_TEST_RUN_DIR": str(run_dir)}
    args = argv(tiny_model_dir, tmp_path, name, "--resume", "auto")  # the first start too
    pid = fork_server.run(
        args, log, env=env, hooks="reliability.shutdown_hooks:install", new_group=True
    )
    marker = tmp_path / f"in_{phase}"
    assert wait_for(marker.exists, pid), log.read_text()[-3000:]  # inside step 2's phase
    group = group_of(pid)
    assert len(group) >= 4, group  # the run, two reward workers, the maths checker
    if to_group:
        os.killpg(pid, sig)
    else:
        os.kill(pid, sig)
    code = fork_server.wait(pid)
    text = log.read_text()
    assert code == 4, text[-3000:]
    status = read_status(run_dir)
    # an update under way finishes, and so does its step; a rollout is abandoned
    done = 2 if phase == "update" else 1
    assert (status["state"], status["signal"], status["step"]) == ("preempted", sig.name, done)
    assert f"preempted by {sig.name}" in text and "--resume auto" in text
    latest = latest_checkpoint(run_dir)
    assert latest is not None and latest.step == status["step"]
    read_state(latest.path)  # complete and loadable
    assert not [p.name for p in checkpoints_dir(run_dir).iterdir() if p.name.startswith(TMP_PREFIX)]
    assert [m["step"] for m in read_metrics(run_dir)] == list(range(status["step"] + 1))
    deadline = time.monotonic() + 10
    while any(alive(p) for p in group) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in group if alive(p)], "processes of the run left behind"

    # the requeue: the very same command line
    pid = fork_server.run(args, tmp_path / "resume.txt")
    assert fork_server.wait(pid) == 0, (tmp_path / "resume.txt").read_text()[-3000:]
    assert f"from step_{status['step']:06d}" in (tmp_path / "resume.txt").read_text()
    assert assert_equal_to_reference(run_dir, reference, MAX_STEPS) == 0
    add("preemption", signals=1, steps_lost=0, child_processes_left=0)


@pytest.fixture(scope="module")
def reference_with_evals(fork_server, tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference_evals")
    pid = fork_server.run(argv(tiny_model_dir, out, "ref", "eval.every=2"), out / "log.txt")
    assert fork_server.wait(pid) == 0, (out / "log.txt").read_text()[-3000:]
    return out / "ref"


GRACE_S = 3.0
SLOW_EVAL_S = 6.0


@pytest.mark.parametrize(
    ("phase", "env"),
    [
        # the signal in step 2's update (paused 1 s): the update finishes, then step 2's
        # scheduled evaluation (planted: 6 s) would run before the checkpoint
        pytest.param(
            "update", {"RLVR_TEST_PAUSE_S": "1", "RLVR_TEST_SLOW_EVAL_S": str(SLOW_EVAL_S)}
        ),
        # the signal inside step 2's evaluation (paused 6 s): it is cut short
        pytest.param("eval", {"RLVR_TEST_PAUSE_S": str(SLOW_EVAL_S)}),
    ],
)
def test_a_stop_signal_skips_the_evaluation_and_checkpoints_within_the_grace(
    phase, env, fork_server, tiny_model_dir, tmp_path, reference_with_evals
) -> None:
    """A slow evaluation is due at step 2 (``eval.every=2``). The checkpoint of step 2 is
    complete less than ``train.stop_grace_s`` after the signal (measured: the signal's time here,
    the checkpoint's COMPLETE marker's modification time), with no evaluation in between; the
    checkpoint notes the skipped evaluation and the resumed run evaluates step 2 first, so it ends
    equal (every metrics line, eval scores included, and the weights) to an uninterrupted run."""
    name = "preempted"
    run_dir = tmp_path / name
    log = tmp_path / "log.txt"
    env = {**env, "RLVR_TEST_PAUSE_IN": phase, "RLVR_TEST_RUN_DIR": str(run_dir)}
    grace = f"train.stop_grace_s={GRACE_S:g}"
    args = argv(tiny_model_dir, tmp_path, name, "eval.every=2", grace, "--resume", "auto")
    pid = fork_server.run(args, log, env=env, hooks="reliability.shutdown_hooks:install")
    assert wait_for((tmp_path / f"in_{phase}").exists, pid), log.read_text()[-3000:]
    sent = time.time()
    os.kill(pid, signal.SIGTERM)
    assert fork_server.wait(pid) == 4, log.read_text()[-3000:]
    status = read_status(run_dir)
    assert (status["state"], status["step"]) == ("preempted", 2), status
    latest = latest_checkpoint(run_dir)
    assert latest is not None and latest.step == 2
    took = (latest.path / "COMPLETE").stat().st_mtime - sent
    assert took < GRACE_S, f"checkpoint {took:.2f} s after the signal"
    assert not (run_dir / "eval" / "step_000002.json").exists()  # skipped, not run
    assert read_state(latest.path)[1]["extra"]["evaluator"]["pending"] == 2
    print(f"{phase}: checkpoint {took:.2f} s after the signal")

    pid = fork_server.run(args, tmp_path / "resume.txt")
    assert fork_server.wait(pid) == 0, (tmp_path / "resume.txt").read_text()[-3000:]
    assert (run_dir / "eval" / "step_000002.json").exists()
    assert any(k.startswith("eval/") for k in read_metrics(run_dir)[2])  # step 2's scores
    assert assert_equal_to_reference(run_dir, reference_with_evals, MAX_STEPS) == 0


def test_an_update_past_the_grace_is_abandoned_and_says_no_checkpoint(
    tiny_model_dir, tmp_path, capsys, restore_threads
) -> None:
    """The update of step 2 outlasts ``train.stop_grace_s`` after SIGTERM (the probe sleeps in
    it): the run stops inside it, writes no checkpoint of a half-updated state, and says so."""
    from reliability.shutdown_hooks import interrupt_in
    from rlvr.cli.main import main as cli_main

    run_dir = tmp_path / "slow"

    def sigterm_then_a_long_update() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the grace (0.3 s) ends in here

    remove = interrupt_in("update", run_dir, sigterm_then_a_long_update)
    try:
        code = cli_main(argv(tiny_model_dir, tmp_path, "slow", "train.stop_grace_s=0.3"))
    finally:
        remove()
    assert code == 4
    status = read_status(run_dir)
    assert (status["state"], status["signal"], status["step"]) == ("preempted", "SIGTERM", 1)
    assert "did not finish within train.stop_grace_s=0.3" in status["checkpoint"]
    assert latest_checkpoint(run_dir) is None  # save_every=0: nothing to resume but the start
    assert "preempted by SIGTERM after step 1" in capsys.readouterr().err
    # the handlers were put back: SIGTERM is again the default action for this process
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_signals_repeated_during_an_update_do_not_extend_the_grace(
    tiny_model_dir, tmp_path, restore_threads
) -> None:
    """SIGTERM in step 2's update, then again every 0.1 s for 2 s (a supervisor that repeats
    itself) while the update runs on: the grace (0.5 s) counts from the first signal, so the update
    is abandoned about 0.5 s after it, not 0.5 s after the last one (the update would then have
    finished: a grace restarted by every signal never ends while they keep coming)."""
    from reliability.shutdown_hooks import interrupt_in
    from rlvr.cli.main import main as cli_main

    run_dir = tmp_path / "again"
    first: list[float] = []

    def repeated_sigterm() -> None:
        first.append(time.monotonic())
        for _ in range(20):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)

    remove = interrupt_in("update", run_dir, repeated_sigterm)
    try:
        code = cli_main(argv(tiny_model_dir, tmp_path, "again", "train.stop_grace_s=0.5"))
    finally:
        remove()
    took = time.monotonic() - first[0]
    assert code == 4
    status = read_status(run_dir)
    assert (status["state"], status["step"]) == ("preempted", 1), status
    assert "did not finish within train.stop_grace_s=0.5" in status["checkpoint"]
    assert took < 1.5, f"stopped {took:.2f} s after the first signal"


def test_a_failed_stop_checkpoint_says_failed_in_status(
    tiny_model_dir, tmp_path, monkeypatch, restore_threads
) -> None:
    """SIGTERM in step 2's update; writing the checkpoint of step 2 then fails (a full disk):
    status.json says "failed" and names the stop checkpoint's failure, not "running"."""
    import rlvr.training.loop as loop_module
    from reliability.shutdown_hooks import interrupt_in
    from rlvr.cli.main import main as cli_main

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(loop_module, "save_checkpoint", full_disk)
    run_dir = tmp_path / "full"
    remove = interrupt_in("update", run_dir, lambda: os.kill(os.getpid(), signal.SIGTERM))
    try:
        with pytest.raises(OSError, match="No space left on device"):
            cli_main(argv(tiny_model_dir, tmp_path, "full"))
    finally:
        remove()
    status = read_status(run_dir)
    assert status["state"] == "failed", status
    assert "the checkpoint on SIGTERM failed" in status["error"], status
    assert "No space left on device" in status["error"]
    assert status["step"] == 2


@pytest.mark.parametrize("value", ["[SIGKILL]", "[SIGINT]", "[SIGALRM]", "SIGTERM"])
def test_stop_signals_refuses_what_cannot_or_must_not_be_handled(value) -> None:
    from rlvr.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="train.stop_signals"):
        load_config(None, [f"train.stop_signals={value}"])


def test_one_rank_signalled_stops_both_ranks_at_the_same_step(tiny_model_dir, tmp_path) -> None:
    """torchrun, 2 CPU ranks, FSDP2 (sharded checkpoints): SIGUSR1 to rank 1 alone, while both
    ranks are in step 2's rollout. No rank abandons a step (the other would wait in a collective
    for ever); at its end the ranks agree through the process group, both write their shards of
    step 2, both exit with 4. ``--resume auto`` then ends equal to an uninterrupted 2-rank run."""
    import subprocess

    from tests.training.dist_support import TORCHRUN, computed, run, steps, train_args, weights

    def args(name: str) -> list[str]:
        return train_args(tiny_model_dir, tmp_path, name, MAX_STEPS, "train.parallel=fsdp2")

    run(TORCHRUN, args("ref"), tmp_path)
    run_dir = tmp_path / "two"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "RLVR_TEST_HOOKS": "reliability.shutdown_hooks:install",
        "RLVR_TEST_PAUSE_IN": "rollout",
        "RLVR_TEST_RUN_DIR": str(run_dir),
    }
    log = tmp_path / "two.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*TORCHRUN, "-m", "rlvr", "train", *args("two"), "--resume", "auto"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        assert wait_for((tmp_path / "in_rollout").exists, proc.pid, 300), log.read_text()[-3000:]
        ranks = {}
        for child in psutil.Process(proc.pid).children():  # the agent's workers (their reward
            ranks[int(child.environ()["RANK"])] = child.pid  # workers inherit RANK too)
        assert sorted(ranks) == [0, 1], ranks
        everyone = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
        os.kill(ranks[1], signal.SIGUSR1)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert "exitcode  : 4" in text or "exitcode: 4" in text, text[-3000:]  # torchrun's summary
    status = read_status(run_dir)
    assert (status["state"], status["signal"], status["step"]) == ("preempted", "SIGUSR1", 2)
    latest = latest_checkpoint(run_dir)
    assert latest is not None and latest.step == 2
    assert len(list((latest.path / "dcp").glob("*.distcp"))) == 2  # both ranks' shards
    assert not [p.name for p in checkpoints_dir(run_dir).iterdir() if p.name.startswith(TMP_PREFIX)]
    gone = [p for p in everyone if alive(p)]
    assert not gone, "processes of the run left behind"

    run(TORCHRUN, [*args("two"), "--resume", "auto"], tmp_path)
    got, want = steps(run_dir), steps(tmp_path / "ref")
    assert [m["step"] for m in got] == list(range(1, MAX_STEPS + 1))
    for g, w in zip(got, want, strict=True):
        assert computed(g) == computed(w), g["step"]
    a, b = weights(run_dir / "final"), weights(tmp_path / "ref" / "final")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    add("preemption", signals=1, steps_lost=0, child_processes_left=0)


def test_one_rank_past_the_grace_leaves_the_update_with_the_other(tiny_model_dir, tmp_path) -> None:
    """torchrun, 2 CPU ranks (gloo), ``train.stop_grace_s=0.5``: SIGUSR1 reaches rank 1 alone in
    step 2's update, and rank 1 stays in it 3 s, past the grace, while rank 0 goes on into the
    update's collectives. Rank 1 must not leave the update alone (rank 0 would wait in a
    collective for it until the process group's timeout): both leave it together at the next
    minibatch, say "preempted" with no checkpoint of the half-updated step, and exit with 4.
    (Before: rank 1 raised from its handler and exited; rank 0's next gloo collective failed with
    "Connection closed by peer", exit code 1, status.json "failed"; NCCL would wait instead.)"""
    import subprocess

    from tests.training.dist_support import TORCHRUN, train_args

    run_dir = tmp_path / "two"
    args = train_args(tiny_model_dir, tmp_path, "two", MAX_STEPS, "train.stop_grace_s=0.5")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "RLVR_TEST_HOOKS": "reliability.shutdown_hooks:grace_over_on_rank_1",
        "RLVR_TEST_RUN_DIR": str(run_dir),
    }
    log = tmp_path / "two.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*TORCHRUN, "-m", "rlvr", "train", *args],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        assert wait_for((tmp_path / "in_update").exists, proc.pid, 300), log.read_text()[-3000:]
        t = time.monotonic()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 60 s after the signal:\n{log.read_text()[-3000:]}")
        print(f"both ranks gone {time.monotonic() - t:.1f} s after the signal")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert "exitcode  : 4" in text or "exitcode: 4" in text, text[-3000:]
    status = read_status(run_dir)
    assert (status["state"], status["signal"], status["step"]) == ("preempted", "SIGUSR1", 1)
    assert "did not finish within train.stop_grace_s=0.5" in status["checkpoint"], status
    assert latest_checkpoint(run_dir) is None
