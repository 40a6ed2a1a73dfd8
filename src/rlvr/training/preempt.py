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
  ``train.stop_grace_s`` of the first signal (later signals do not restart the timer), after which
  the step completes and the run stops at its end; past the grace ``Preempted(half_updated=True)``
  is raised and no checkpoint is written (the newest periodic one is named instead);
- after the update: only what the checkpoint needs runs. The step's weight push to an engine is
  skipped (a resume pushes the restored weights), its evaluation and samples are skipped (an
  evaluation under way is cut short, ``cut_short``; the checkpoint notes it and the resumed run
  evaluates that step first), and of the batches generated ahead (``rollout.max_staleness``) only
  the finished ones are kept (``training/overlap.Lookahead.state_dict``).

Several processes (torchrun), or batches generated ahead (``rollout.max_staleness`` > 0):
no step is abandoned before its update (a rank leaving a collective would hang the others; the
batches ahead are already drawn). The ranks agree through the process group (``requested``)
whether any of them got a signal, right after the update (so that all skip the evaluation, a
collective) and at the step's end: one rank receiving it is enough. An evaluation under way is
not cut short (the ranks evaluate together). Past the grace, a rank raises nothing from its
handler (it would leave the others inside a collective of the update: they would wait for it
until the process group's timeout); it notes ``grace_over``, and the update's next minibatch,
whose denominators every rank sums anyway, carries the note: every rank abandons the update
there, together (``abandon_update``).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from rlvr.checkpoint.full import rng_state, set_rng_state
from rlvr.distributed import DistInfo, all_reduce_sum
from rlvr.training.state import TrainState

# Beside 0 ok, 1 error, 2 bad config or input, 3 health gate, 130 Ctrl-C: a requeue script can
# tell "stopped by a signal, checkpointed, resume me" from a failure.
PREEMPTED_EXIT_CODE = 4

T = TypeVar("T")


class Preempted(BaseException):
    """A stop signal ended the run. A BaseException, like KeyboardInterrupt, so that no
    ``except Exception`` on the way (a reward's failure containment) takes it for an error."""

    def __init__(
        self, signum: int, *, abandoned: bool = False, half_updated: bool = False, cut: bool = False
    ) -> None:
        self.signum = signum
        self.abandoned = abandoned  # raised before the step's update: ``rewind`` undoes it
        self.half_updated = half_updated  # raised in an update past the grace: no checkpoint
        self.cut = cut  # raised in work ``cut_short`` runs (an evaluation): caught there
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.signal_name}")


class StopSignals:
    """The handlers of one ``fit``: ``install`` at its start, ``restore`` at its end.

    ``abandon``: a step may be abandoned before its update (one process, nothing drawn ahead).
    ``ranks``: several processes; nothing is raised from a handler where the others could be
    inside a collective with this one (the update past the grace, an evaluation)."""

    def __init__(
        self, names: list[str], grace_s: float, *, abandon: bool, ranks: bool = False
    ) -> None:
        self.signals = [signal.Signals[name] for name in names]
        self.grace_s = grace_s
        self.abandon = abandon
        self.ranks = ranks
        self.signum: int | None = None  # the first stop signal received (or agreed on)
        self.grace_over = False  # several ranks: the grace ran out here, the update not yet left
        self._window = "abandon"  # before the first step: nothing to lose
        self._timer = False  # the grace timer runs (started by the first signal in an update)
        self._previous: dict[int, object] = {}
        self._mark: tuple[dict, dict, dict] | None = None

    @property
    def stopping(self) -> bool:
        """A stop signal came (to this rank, or to any rank once they agreed)."""
        return self.signum is not None

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
        if self._window == "cut":
            self._window = "finish"
            raise Preempted(signum, cut=True)
        if self._window == "update" and not self._timer:  # later signals keep the first's timer
            if self.grace_s > 0:
                self._timer = True
                signal.setitimer(signal.ITIMER_REAL, self.grace_s)
            else:  # no grace: the update is abandoned at once
                self._grace_over()

    def _on_grace_over(self, signum: int, frame) -> None:
        if self._window == "update" and self.signum is not None:
            self._grace_over()

    def _grace_over(self) -> None:
        if self.ranks:  # raised here, it would leave the other ranks inside a collective
            self.grace_over = True
            return
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
            self._timer = False
            self._window = "finish"

    def abandon_update(self, info: DistInfo) -> None:
        """Several ranks, between two minibatches of the update, once one of them noted
        ``grace_over`` (the update's sum over ranks told every rank): all leave it here."""
        self.grace_over = False
        signum = self.requested(info)
        self._window = "finish"
        raise Preempted(signum if signum is not None else signal.SIGTERM, half_updated=True)

    def cut_short(self, fn: Callable[..., T], *args) -> T | None:
        """``fn(*args)``, or None when a stop signal came before or during it: work the
        checkpoint does not need (an evaluation). With several ranks it runs to its end
        (the ranks do it together) unless a signal came before."""
        if self.signum is not None:
            return None
        if self.ranks:
            return fn(*args)
        try:
            try:
                self._window = "cut"
                return fn(*args)
            finally:
                self._window = "finish"
        except Preempted as exc:
            if not exc.cut:
                raise
            return None

    def rewind(self, state: TrainState) -> None:
        """Undo an abandoned step's rollout: the state is again that of the last finished step."""
        if self._mark is not None:
            sampler, plain, tensors = self._mark
            state.sampler.load_state_dict(sampler)
            set_rng_state(plain, tensors)

    def requested(self, info: DistInfo) -> int | None:
        """The signal to stop on, if any rank got one (all ranks agree: with several ranks, a
        collective every rank calls at the same point)."""
        if not info.enabled:
            return self.signum
        # one sum over ranks of a slot per signal number: the ranks learn which were received
        slots = [0.0] * signal.NSIG
        if self.signum is not None:
            slots[self.signum] = 1.0
        got = [i for i, v in enumerate(all_reduce_sum(slots, info)) if v > 0]
        self.signum = max(got) if got else None
        return self.signum
