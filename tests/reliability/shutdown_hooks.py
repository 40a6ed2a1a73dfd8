"""Probes that let a test interrupt a run inside a chosen phase of a chosen step.

``interrupt_in(phase, run_dir, action, after_step=1)`` wraps the rollout engine's ``generate``
(phase "rollout") or the step's ``update`` (phase "update") so that the first call made
after step ``after_step`` has been logged runs ``action()`` (e.g. send SIGINT) before doing its
work: the action happens inside that phase of step ``after_step + 1``.

``install()`` is the same for a forked run (``forkserver`` "hooks"): it reads the phase from
``RLVR_TEST_PAUSE_IN``, the run directory from ``RLVR_TEST_RUN_DIR`` and, as its action, touches
``RUN_DIR/../in_<phase>`` and then pauses ``PAUSE_S`` so a signal sent by the test on seeing that
file arrives while the run is inside the phase.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

PHASES = ("rollout", "update")
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
    from rlvr.rollout.hf import HFEngine

    fired = []
    owner, attr = (HFEngine, "generate") if phase == "rollout" else (step_module, "update")
    real = getattr(owner, attr)

    def probe(*args, **kwargs):
        if not fired and _step_logged(run_dir, after_step):
            fired.append(True)
            action()
        return real(*args, **kwargs)

    setattr(owner, attr, probe)
    return lambda: setattr(owner, attr, real)


def install() -> None:
    phase = os.environ["RLVR_TEST_PAUSE_IN"]
    run_dir = Path(os.environ["RLVR_TEST_RUN_DIR"])

    def mark_and_pause() -> None:
        (run_dir.parent / f"in_{phase}").touch()
        time.sleep(PAUSE_S)

    interrupt_in(phase, run_dir, mark_and_pause)
