"""Process faults: a run SIGKILLed again and again at random points (during start-up, mid-step and
in the middle of checkpoint writes), each time resumed, ends with the same weights and the same
per-step metrics as a run that was never interrupted, and never leaves a checkpoint that looks
complete but is not. A disk that fills up during a checkpoint write fails that save with a clear
error and leaves the previous checkpoint usable.

Every run is a separate process forked from ``forkserver.py`` (so a kill costs no import time);
all use one torch thread, so the comparison with the uninterrupted run is bit for bit.
"""

from __future__ import annotations

import os
import random
import resource
import signal
import time
from collections import Counter
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from reliability.figures import record
from reliability.limits import FILE_SIZE_ENV
from reliability.procs import exited, sleep_while_running, wait_for
from reliability.runs import assert_equal_to_reference, read_status, tiny_overrides
from rlvr.checkpoint.full import (
    TMP_PREFIX,
    checkpoint_name,
    checkpoints_dir,
    latest_checkpoint,
    read_marker,
    read_state,
)
from rlvr.telemetry.sinks import read_metrics
from sitecustomize import SLOW_SAVE_ENV

MAX_STEPS = 8
KILLS = 12
MAX_ROUNDS = 40


def argv(model_dir: Path, out: Path, name: str) -> list[str]:
    return [
        "train",
        *tiny_overrides(model_dir, out, name),
        f"train.max_steps={MAX_STEPS}",
        "train.save_every=1",
        "train.max_checkpoints=2",
        "train.resume=auto",  # the same command starts the run, or continues it
    ]


@pytest.fixture(scope="module")
def reference(fork_server, tiny_model_dir, tmp_path_factory) -> Path:
    """The uninterrupted run every interrupted one must end up equal to."""
    out = tmp_path_factory.mktemp("reference")
    pid = fork_server.run(argv(tiny_model_dir, out, "ref"), out / "log.txt")
    assert fork_server.wait(pid) == 0, (out / "log.txt").read_text()[-3000:]
    return out / "ref"


def verify_checkpoints(run_dir: Path) -> int:
    """Every checkpoint folder that claims to be complete loads in full; returns how many.

    ``.tmp-*`` folders (a write that was interrupted) and ``step_*`` folders without a valid
    ``COMPLETE`` (a deletion that was interrupted) are never loaded, so they may be partial.
    """
    verified = 0
    folder = checkpoints_dir(run_dir)
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if path.name.startswith(TMP_PREFIX) or read_marker(path) is None:
            continue
        tensors, plain = read_state(path)
        assert plain["step"] == int(path.name.split("_")[1])
        weights = load_file(str(path / "model" / "model.safetensors"))
        assert weights and all(torch.isfinite(t).all() for t in weights.values())
        assert "optimizer" in tensors and "rng" in tensors
        verified += 1
    latest = latest_checkpoint(run_dir)
    assert verified == 0 or latest is not None
    return verified


def fresh_checkpoint(run_dir: Path, step: int, since: float) -> bool:
    """Checkpoint ``step`` is complete and was written after ``since`` (by this process)."""
    manifest = read_marker(checkpoints_dir(run_dir) / checkpoint_name(step))
    return manifest is not None and manifest["time"] >= since


def fresh_tmp_folders(run_dir: Path, since: float, step: int | None = None) -> list[Path]:
    """Temporary checkpoint folders (of ``step``, or any) created after ``since``: writes still
    in progress, or torn by a kill."""
    folder = checkpoints_dir(run_dir)
    if not folder.is_dir():
        return []
    out = []
    pattern = TMP_PREFIX + (checkpoint_name(step) if step is not None else "*")
    for path in folder.glob(pattern):
        try:
            if path.stat().st_mtime >= since - 0.05:
                out.append(path)
        except FileNotFoundError:  # renamed into place meanwhile
            pass
    return out


def latest_step(run_dir: Path) -> int:
    found = latest_checkpoint(run_dir)
    return found.step if found else 0


def test_twelve_sigkills_then_resume_equal_an_uninterrupted_run(
    fork_server, reference, tiny_model_dir, tmp_path
) -> None:
    rng = random.Random(9)
    steps = [m["time_step"] for m in read_metrics(reference) if m["step"] > 0]
    step_seconds = sum(steps) / len(steps)
    # What each kill aims at, in a random order: start-up (model load, resume, eval), a random
    # moment of the step after a checkpoint, a checkpoint write (and the same with the test hook
    # pausing the write for a second between the model files and COMPLETE, so the kill tears it).
    kinds = rng.sample(["startup", "after_save", "in_save", "in_save_slow"] * (KILLS // 4), KILLS)
    # Where: steps spread over the run, 1 1 2 2 3 3 4 4 5 5 6 7 for 8 steps and 12 kills.
    targets = [1 + i * (MAX_STEPS - 2) // (KILLS - 1) for i in range(KILLS)]
    name = "killed"
    run_dir = tmp_path / name
    kills: list[dict] = []
    verified = 0
    for round_ in range(1, MAX_ROUNDS + 1):
        if len(kills) >= KILLS:
            break
        done = latest_step(run_dir)
        kind = kinds[len(kills)]
        target = min(max(targets[len(kills)], done + 1), MAX_STEPS)
        env = {SLOW_SAVE_ENV: "1.0"} if kind == "in_save_slow" else {}
        log = tmp_path / f"round{round_}.log"
        since = time.time()
        pid = fork_server.run(argv(tiny_model_dir, tmp_path, name), log, env=env)
        if kind == "startup":
            alive = sleep_while_running(rng.uniform(0.0, 1.0), pid)
        elif kind == "after_save":
            alive = wait_for(partial(fresh_checkpoint, run_dir, target, since), pid)
            alive = alive and sleep_while_running(rng.uniform(0.0, step_seconds), pid)
        else:
            alive = wait_for(partial(fresh_tmp_folders, run_dir, since, target), pid)
            alive = alive and sleep_while_running(rng.uniform(0.0, 0.005), pid)
        if not alive or exited(pid):
            code = fork_server.wait(pid)
            assert code == 0, log.read_text()[-3000:]
            continue  # it finished before the kill point: no kill this round
        os.kill(pid, signal.SIGKILL)
        assert fork_server.wait(pid) == -signal.SIGKILL
        torn = bool(fresh_tmp_folders(run_dir, since))
        verified += verify_checkpoints(run_dir)
        read_metrics(run_dir)  # readable: at most a torn last line, which it skips
        kills.append(
            {
                "kind": kind,
                "target": target,
                "checkpoint_before": done,
                "killed_after_s": round(time.time() - since, 3),
                "torn_write": torn,
                "checkpoint_after": latest_step(run_dir),
            }
        )
    shown = "\n".join(map(str, kills))
    assert len(kills) >= KILLS, shown
    # Kills inside a paused write tear it (unless this process was descheduled for the whole
    # second of the pause); kills at an unpaused write may land a moment after it.
    torn_paused = [k["torn_write"] for k in kills if k["kind"] == "in_save_slow"]
    assert sum(torn_paused) >= len(torn_paused) - 1, shown

    pid = fork_server.run(argv(tiny_model_dir, tmp_path, name), tmp_path / "final.log")
    assert fork_server.wait(pid) == 0, (tmp_path / "final.log").read_text()[-3000:]
    lost = assert_equal_to_reference(run_dir, reference, MAX_STEPS)
    assert lost == 0
    verified += verify_checkpoints(run_dir)
    assert not list(checkpoints_dir(run_dir).glob(TMP_PREFIX + "*"))  # leftovers cleaned up
    record(
        "process_faults",
        sigkills_survived=len(kills),
        kills_by_kind=dict(Counter(k["kind"] for k in kills)),
        newest_checkpoint_after_each_kill=[k["checkpoint_after"] for k in kills],
        kills_that_tore_a_checkpoint_write=sum(k["torn_write"] for k in kills),
        complete_checkpoints_verified_after_kills=verified,
        corrupt_checkpoints_loaded=0,
        bytes_lost_final_weights=lost,
        steps_compared=MAX_STEPS,
    )


def test_a_full_disk_fails_the_save_clearly_and_keeps_the_previous_checkpoint(
    fork_server, reference, tiny_model_dir, tmp_path
) -> None:
    name = "full-disk"
    run_dir = tmp_path / name
    log = tmp_path / "full.log"
    since = time.time()
    pid = fork_server.run(argv(tiny_model_dir, tmp_path, name), log)
    assert wait_for(lambda: fresh_checkpoint(run_dir, 1, since), pid)
    # From now on no file of this process may grow past 64 KiB: the model weights (about
    # 320 KB) of the next checkpoint cannot be written, the metrics file (2 KB a step) can.
    limit = 64 * 1024
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, limit))
    code = fork_server.wait(pid)
    printed = log.read_text()
    assert code != 0, printed[-3000:]
    status = read_status(run_dir)
    assert status["state"] == "failed"
    error = status["error"]
    assert "could not write the checkpoint of step 2" in error
    assert "File too large" in error
    assert f"still {checkpoints_dir(run_dir) / checkpoint_name(1)}" in error
    # said on the terminal too, as one message rather than a traceback
    assert "rlvr: error: could not write the checkpoint of step 2" in printed
    assert "Traceback" not in printed
    assert latest_step(run_dir) == 1
    assert verify_checkpoints(run_dir) == 1
    assert not list(checkpoints_dir(run_dir).glob(TMP_PREFIX + "*"))  # the partial save is gone

    # With space again, the run resumes from that checkpoint and ends as if nothing happened.
    pid = fork_server.run(argv(tiny_model_dir, tmp_path, name), tmp_path / "resume.log")
    assert fork_server.wait(pid) == 0, (tmp_path / "resume.log").read_text()[-3000:]
    lost = assert_equal_to_reference(run_dir, reference, MAX_STEPS)
    assert lost == 0
    record(
        "full_disk",
        saves_failed_cleanly=1,
        previous_checkpoint_usable=True,
        resumed_equal_to_uninterrupted=True,
        bytes_lost=lost,
    )


def test_a_full_disk_while_a_resume_starts_leaves_the_run_resumable(
    fork_server, reference, tiny_model_dir, tmp_path
) -> None:
    """A resume rewrites RUN_DIR/config.yaml, which `rlvr train --resume RUN_DIR` reads back. A
    disk that is full at that moment must not leave a torn config.yaml behind: the next resume
    has to continue the run with its own settings, and end as if nothing had happened."""
    name = "full-at-start"
    run_dir = tmp_path / name
    since = time.time()
    pid = fork_server.run(argv(tiny_model_dir, tmp_path, name), tmp_path / "first.log")
    assert wait_for(partial(fresh_checkpoint, run_dir, 2, since), pid)
    os.kill(pid, signal.SIGKILL)
    assert fork_server.wait(pid) == -signal.SIGKILL
    saved_config = (run_dir / "config.yaml").read_text()

    # The next start finds the disk full: no file may grow past 1 KiB (config.yaml is ~3 KB).
    log = tmp_path / "full.log"
    pid = fork_server.run(
        ["train", "--resume", str(run_dir)],
        log,
        env={FILE_SIZE_ENV: "1024"},
        hooks="reliability.limits:limit_file_size",
    )
    assert fork_server.wait(pid) != 0, log.read_text()[-3000:]

    # Space again: the documented command continues the same run from its checkpoint.
    assert (run_dir / "config.yaml").read_text() == saved_config
    pid = fork_server.run(["train", "--resume", str(run_dir)], tmp_path / "resume.log")
    assert fork_server.wait(pid) == 0, (tmp_path / "resume.log").read_text()[-3000:]
    assert assert_equal_to_reference(run_dir, reference, MAX_STEPS) == 0
