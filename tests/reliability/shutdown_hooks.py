"""Probes that let a test interrupt a run inside a chosen phase of a chosen step.

``interrupt_in(phase, run_dir, action, after_step=1)`` wraps the rollout engine's ``generate``
(phase "rollout"), the step's ``update`` (phase "update") or the in-training evaluation (phase
"eval") so that the first call made after step ``after_step`` has been logged runs ``action()``
(e.g. send SIGINT) before doing its work: the action happens inside that phase of step
``after_step + 1``.

``install()`` is the same for a forked run (``forkserver`` "hooks"): it reads the phase from
``RLVR_TEST_PAUSE_IN``, the run directory from ``RLVR_TEST_RUN_DIR`` and, as its action, touches
``RUN_DIR/../in_<phase>`` and then pauses ``RLVR_TEST_PAUSE_S`` seconds (default ``PAUSE_S``) so
a signal sent by the test on seeing that file arrives while the run is inside the phase.
``RLVR_TEST_SLOW_EVAL_S``: every evaluation after the one before training also takes that many
seconds longer (a slow evaluation, planted).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

PHASES = ("rollout", "update", "eval")
PAUSE_S = 2.0


def _step_logged(run_dir: Path, step: int) -> bool:
    from rlvr.telemetry.sinks import read_metrics

    return any(m["step"] == step for m in read_metrics(run_dir)) if run_dir.exists() else False


def interrupt_in(
    phase: str, run_dir: Path, action: Callable[[], None], after_step: int = 1
) -> Callable[[], None]:
    """Install the probe; returns a function that removes it."""
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; known: {PHASES}")
    import rlvr.training.step as step_module
    from rlvr.eval.in_training import InTrainingEvaluator
    from rlvr.rollout.hf import HFEngine

    fired = []
    owner, attr = {
        "rollout": (HFEngine, "generate"),
        "update": (step_module, "update"),
        "eval": (InTrainingEvaluator, "_evaluate"),
    }[phase]
    real = getattr(owner, attr)

    def probe(*args, **kwargs):
        if not fired and _step_logged(run_dir, after_step):
            fired.append(True)
            action()
        return real(*args, **kwargs)

    setattr(owner, attr, probe)
    return lambda: setattr(owner, attr, real)


def slow_evaluations(seconds: float) -> None:
    """Every evaluation at a step > 0 sleeps ``seconds`` before evaluating."""
    from rlvr.eval.in_training import InTrainingEvaluator

    real = InTrainingEvaluator._evaluate

    def slow(self, step: int) -> dict:
        if step > 0:
            time.sleep(seconds)
        return real(self, step)

    InTrainingEvaluator._evaluate = slow


def install() -> None:
    if os.environ.get("RLVR_TEST_SLOW_EVAL_S"):
        slow_evaluations(float(os.environ["RLVR_TEST_SLOW_EVAL_S"]))
    phase = os.environ["RLVR_TEST_PAUSE_IN"]
    run_dir = Path(os.environ["RLVR_TEST_RUN_DIR"])
    pause = float(os.environ.get("RLVR_TEST_PAUSE_S", PAUSE_S))

    def mark_and_pause() -> None:
        (run_dir.parent / f"in_{phase}").touch()
        time.sleep(pause)

    interrupt_in(phase, run_dir, mark_and_pause)


def grace_over_on_rank_1() -> None:
    """torchrun: rank 1 alone gets SIGUSR1 in step 2's update and stays in it 3 s (past a
    shorter ``train.stop_grace_s``); rank 0 meanwhile goes on into the update's collectives."""
    import signal

    if os.environ.get("RANK") != "1":
        return
    run_dir = Path(os.environ["RLVR_TEST_RUN_DIR"])

    def signal_and_stay() -> None:
        (run_dir.parent / "in_update").touch()
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(3)

    interrupt_in("update", run_dir, signal_and_stay)
