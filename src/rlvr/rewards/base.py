"""The value every reward returns, and the shape of a reward function."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class RewardResult:
    """One completion's reward.

    ``score`` is the scalar the advantage estimator sees. ``info`` holds diagnostics as
    floats only (e.g. ``correct``, ``has_boxed``), so the runner can average every key
    into step metrics without caring which reward produced it.
    """

    score: float
    info: dict[str, float] = field(default_factory=dict)


class RewardFn(Protocol):
    """A reward: ``f(prompt, response, reference, **row) -> float | RewardResult``.

    ``row`` carries the dataset row's other fields (e.g. a Countdown row's ``numbers``
    and ``target``) plus ``truncated`` (generation hit its length limit). The runner
    drops the row's own ``prompt``, ``response``, ``reference`` and ``truncated`` keys
    so they cannot clash with these arguments. A bool return counts as 0.0 / 1.0.
    """

    def __call__(
        self, prompt: str, response: str, reference: str, **row: Any
    ) -> float | RewardResult: ...
