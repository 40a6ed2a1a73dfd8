"""Which prompts go into a step, and how a rollout batch is cut into minibatches and micro-batches.

Minibatches are cut at prompt-group boundaries: a listwise objective (maxent_listwise) computes its
loss over a whole group, which a stock shuffle of flat rows silently corrupts.
Micro-batches only split the work of one minibatch (every loss divides by minibatch-wide counts),
so they may regroup sequences by length, except for the listwise objective.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class PromptSampler:
    """Deterministic, resumable pass over ``num_rows`` rows: a fresh seeded shuffle per epoch."""

    num_rows: int
    prompts_per_step: int
    seed: int = 0
    epoch: int = 0
    position: int = 0

    def __post_init__(self) -> None:
        if self.num_rows < 1:
            raise ValueError("the training set is empty")
        self._order = self._shuffled(self.epoch)

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(self.num_rows))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next_indices(self) -> list[int]:
        out: list[int] = []
        while len(out) < self.prompts_per_step:
            if self.position >= self.num_rows:
                self.epoch += 1
                self.position = 0
                self._order = self._shuffled(self.epoch)
            out.append(self._order[self.position])
            self.position += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.seed = state["seed"]
        self.epoch = state["epoch"]
        self.position = state["position"]
        self._order = self._shuffled(self.epoch)


def group_minibatches(
    num_groups: int, group_size: int, num_minibatches: int, *, shuffle_seed: int | None = None
) -> list[list[int]]:
    """Sequence indices of each minibatch; each minibatch holds whole groups (group-major layout).

    With ``shuffle_seed`` the *groups* are shuffled (never the rows inside a group).
    """
    if num_groups % num_minibatches:
        raise ValueError(f"{num_minibatches} minibatches do not divide {num_groups} prompt groups")
    groups = list(range(num_groups))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(groups)
    per = num_groups // num_minibatches
    return [
        [g * group_size + j for g in groups[m * per : (m + 1) * per] for j in range(group_size)]
        for m in range(num_minibatches)
    ]
