"""Early stopping on a held-out metric (docs/evaluation.md).

The rule: stop when the metric got worse than the *previous* eval for `patience` consecutive
evals ("if OOD greedy_pass@1 drops for 2 consecutive evals, stop training"). An eval that is
not worse (better, equal, or worse by no more than `min_delta`) resets the count. This is
not the "no improvement over the best for N evals" rule of Keras and Lightning: a metric that
stays flat below its best never stops training here, and a slide made of steps each smaller
than `min_delta` is not counted as drops.

The best eval (step and value) is tracked for checkpoint selection; the seed notes the best
checkpoint is usually earlier than expected. Ties keep the earlier step.
"""

from __future__ import annotations

import math
from typing import Literal


class EarlyStopper:
    """Counts consecutive drops of one metric; `update` returns True once training should stop.

    Args:
        metric: the metric's name, e.g. "greedy_pass@1" (used in messages and checkpoints).
        mode: "max" when higher is better, "min" when lower is better (a loss).
        patience: consecutive worsening evals that stop training (>= 1).
        min_delta: a change must exceed this to count as worse (>= 0).
    """

    def __init__(
        self,
        metric: str,
        mode: Literal["max", "min"] = "max",
        patience: int = 2,
        min_delta: float = 0.0,
    ) -> None:
        if not isinstance(metric, str) or not metric:
            raise ValueError(f"metric must be a non-empty string, got {metric!r}")
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"patience must be an integer >= 1, got {patience!r}")
        if not (math.isfinite(min_delta) and min_delta >= 0):
            raise ValueError(f"min_delta must be a finite number >= 0, got {min_delta!r}")
        self.metric = metric
        self.mode = mode
        self.patience = patience
        self.min_delta = float(min_delta)
        self._reset()

    def _reset(self) -> None:
        self.history: list[tuple[int, float]] = []
        self.drops = 0  # consecutive evals worse than the one before
        self.stopped = False
        self.best_step: int | None = None
        self.best_value: float | None = None
        self._stop_message = ""

    def update(self, step: int, value: float) -> bool:
        """Record the eval at `step`; return True when training should stop (and from then on)."""
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"{self.metric}: step must be an int, got {step!r}")
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"{self.metric} at step {step} is {value}; cannot compare it")
        if self.history and step <= self.history[-1][0]:
            raise ValueError(
                f"{self.metric}: step {step} is not after the previous eval step "
                f"{self.history[-1][0]}"
            )
        if self.history:
            previous = self.history[-1][1]
            self.drops = self.drops + 1 if self._worse(value, previous) else 0
        self.history.append((step, value))
        if self.best_value is None or self._better(value, self.best_value):
            self.best_step, self.best_value = step, value
        if not self.stopped and self.drops >= self.patience:
            self.stopped = True
            streak = self.history[-(self.patience + 1) :]
            path = " -> ".join(f"{v:.4g} (step {s})" for s, v in streak)
            self._stop_message = (
                f"stop: {self.metric} got worse than the previous eval {self.patience} times "
                f"in a row: {path}"
            )
        return self.stopped

    def _worse(self, value: float, previous: float) -> bool:
        if self.mode == "max":
            return value < previous - self.min_delta
        return value > previous + self.min_delta

    def _better(self, value: float, best: float) -> bool:
        return value > best if self.mode == "max" else value < best

    @property
    def reason(self) -> str:
        """A sentence for the log: why training stopped, or how close it is to stopping."""
        best = (
            f"best {self.metric} {self.best_value:.4g} at step {self.best_step}"
            if self.best_step is not None
            else f"no {self.metric} eval yet"
        )
        if self.stopped:
            return f"{self._stop_message}; {best}."
        return (
            f"continue: {self.drops} of {self.patience} consecutive drops of {self.metric}; {best}."
        )

    def state_dict(self) -> dict:
        """Plain data for a checkpoint: the settings and the (step, value) history."""
        return {
            "metric": self.metric,
            "mode": self.mode,
            "patience": self.patience,
            "min_delta": self.min_delta,
            "history": [[step, value] for step, value in self.history],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore from `state_dict()` by replaying its history.

        The metric and mode must match this stopper's; patience and min_delta come from this
        stopper (the current config), so a resumed run may change them.
        """
        for key in ("metric", "mode", "history"):
            if key not in state:
                raise ValueError(f"early-stop state has no {key!r} (keys: {sorted(state)})")
        for key in ("metric", "mode"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"early-stop state tracks {key}={state[key]!r} but this stopper has "
                    f"{key}={getattr(self, key)!r}"
                )
        self._reset()
        for step, value in state["history"]:
            self.update(int(step), float(value))
