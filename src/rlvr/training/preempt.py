"""Stop signals (``train.stop_signals``: SIGTERM and SIGUSR1 by default): how a cluster stops a job
(Slurm's SIGTERM before SIGKILL, its ``--signal=USR1@120`` warning, Kubernetes' SIGTERM and grace
period). A run stopped by one writes a complete checkpoint of its last finished step, says
"preempted" in ``status.json`` and exits with its own code (``PREEMPTED_EXIT_CODE``), so
``rlvr train --resume auto`` continues it with nothing lost.

Where the signal lands decides what happens, so that the checkpoint equals the one a periodic save
at that step would have written (a resumed run then matches an uninterrupted one bit for bit):

- before the update of a step (rollout, scoring, log-probs): nothing of the train state has
  changed but the prompt sampler's position and the RNG states, which ``begin_step`` noted; the
  step is abandoned at once (``Preempted`` raised from the handler, as Ctrl-C raises
  KeyboardInterrupt) and ``rewind`` puts those two back;
- during the update: the weights are half updated; the update may finish within
  ``train.stop_grace_s``, after which the step completes and the run stops at its end; past the
  grace ``Preempted(half_updated=True)`` is raised and no checkpoint is written (the newest
  periodic one is named instead);
- after the update (sync, evaluation, logging, the periodic save): the step completes first.

Several processes (torchrun), or batches generated ahead (``rollout.max_staleness`` > 0):
no step is abandoned (a rank leaving a collective would hang the others; the batches ahead are
already drawn); every step runs to its end, where the ranks agree through the process group
(``requested``) whether any of them got a signal, so one rank receiving it is enough.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from rlvr.checkpoint.full import rng_state, set_rng_state
from rlvr.distributed import DistInfo, all_reduce_sum
from rlvr.training.state import TrainState

# Beside 0 ok, 1 error, 2 bad config or input, 3 health gate, 130 Ctrl-C: a requeue script can
# tell "stopped by a signal, checkpointed, resume me" from a failure.
PREEMPTED_EXIT_CODE = 4


class Preempted(BaseException):
    """A stop signal ended the run. A BaseException, like KeyboardInterrupt, so that no
    ``except Exception`` on the way (a reward's failure containment) takes it for an error."""

    def __init__(self, signum: int, *, abandoned: bool = False, half_updated: bool = False) -> None:
        self.signum = signum
        self.abandoned = abandoned  # raised before the step's update: ``rewind`` undoes it
        self.half_updated = half_updated  # raised in an update past the grace: no checkpoint
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.signal_name}")


class StopSignals:
    """The handlers of one ``fit``: ``install`` at its start, ``restore`` at its end."""

    def __init__(self, names: list[str], grace_s: float, *, abandon: bool) -> None:
        self.signals = [signal.Signals[name] for name in names]
        self.grace_s = grace_s
        self.abandon = abandon  # may a step be abandoned before its update (one process)
        self.signum: int | None = None  # the first stop signal received
        self._window = "abandon"  # before the first step: nothing to lose
        self._previous: dict[int, object] = {}
        self._mark: tuple[dict, dict, dict] | None = None

    def install(self) -> bool:
        """Handle the stop signals; False (nothing installed) outside the main thread, where
        Python cannot install handlers (a run started from a notebook's worker thread)."""
        if not self.signals or threading.current_thread() is not threading.main_thread():
            return False
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        self._previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, self._on_grace_over)
        return True

    def restore(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _on_signal(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum = signum
        if self._window == "abandon" and self.abandon:
            self._window = "finish"  # a second signal must not break the checkpoint being saved
            raise Preempted(signum, abandoned=True)
        if self._window == "update":
            if self.grace_s > 0:
                signal.setitimer(signal.ITIMER_REAL, self.grace_s)
            else:  # no grace: the update is abandoned at once
                self._window = "finish"
                raise Preempted(signum, half_updated=True)

    def _on_grace_over(self, signum: int, frame) -> None:
        if self._window == "update" and self.signum is not None:
            self._window = "finish"
            raise Preempted(self.signum, half_updated=True)

    # ----------------------------------------------------------------- the step's windows
    def begin_step(self, state: TrainState) -> None:
        """A step starts: note what its rollout changes before the update (the sampler's
        position, the RNG states), so an abandoned step can be undone."""
        plain, tensors = rng_state()
        self._mark = (dict(state.sampler.state_dict()), plain, tensors)
        self._window = "abandon"
        if self.signum is not None and self.abandon:  # came between two steps: stop now
            self._window = "finish"
            raise Preempted(self.signum, abandoned=True)

    @contextlib.contextmanager
    def updating(self) -> Iterator[None]:
        """The update: a signal now lets it finish (within the grace); past it, nothing of the
        step is abandoned any more."""
        self._window = "update"
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self._window = "finish"

    def rewind(self, state: TrainState) -> None:
        """Undo an abandoned step's rollout: the state is again that of the last finished step."""
        if self._mark is not None:
            sampler, plain, tensors = self._mark
            state.sampler.load_state_dict(sampler)
            set_rng_state(plain, tensors)

    def requested(self, info: DistInfo) -> int | None:
        """At a step's end: the signal to stop on, if any rank got one (all ranks agree)."""
        if not info.enabled:
            return self.signum
        # one sum over ranks of a slot per signal number: the ranks learn which were received
        slots = [0.0] * signal.NSIG
        if self.signum is not None:
            slots[self.signum] = 1.0
        got = [i for i, v in enumerate(all_reduce_sum(slots, info)) if v > 0]
        self.signum = max(got) if got else None
        return self.signum
