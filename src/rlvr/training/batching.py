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


def micro_batches(indices: list[int], micro_batch_size: int) -> list[list[int]]:
    """Consecutive slices of ``indices``; with a micro size that is a multiple of the group size
    and group-major ``indices``, each slice holds whole groups."""
    return [indices[i : i + micro_batch_size] for i in range(0, len(indices), micro_batch_size)]


def length_micro_batches(
    indices: list[int],
    prompt_lens: list[int],
    completion_lens: list[int],
    micro_batch_size: int,
    token_budget: int | None = None,
    prompt_keys: list[int] | None = None,
) -> list[list[int]]:
    """Micro-batches of sequences of similar length, so little of each forward pass is padding.

    ``prompt_lens[i]`` / ``completion_lens[i]`` belong to sequence ``i`` (indexed like ``indices``'
    values). Sequences are taken shortest completion first and packed greedily: a micro-batch
    holds at most ``micro_batch_size`` sequences and, with ``token_budget``, at most that many
    padded positions (rows x (longest prompt + longest completion)); a single sequence over the
    budget still gets a micro-batch of its own. Example: completions 5, 60, 6, 58 tokens with
    size 2 give [[5, 6], [58, 60]] instead of [[5, 60], [6, 58]] (half the padded positions).

    ``prompt_keys[i]``: which prompt sequence ``i`` continues, when a micro-batch's forward pass
    runs each distinct prompt once (``algo.share_prompt``). Then a micro-batch costs (distinct
    prompts x longest prompt + rows x longest completion) positions, and keeping a prompt's
    sequences together can beat sorting by length: both packings are made (the second takes
    sequences prompt by prompt, shortest completion first within each) and the cheaper kept.
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size={micro_batch_size}: must be >= 1")
    if token_budget is not None and token_budget < 1:
        raise ValueError(f"token_budget={token_budget}: must be >= 1 (or None)")
    by_length = sorted(indices, key=lambda i: (completion_lens[i], prompt_lens[i], i))
    plan = _pack(by_length, prompt_lens, completion_lens, micro_batch_size, token_budget)
    if prompt_keys is None:
        return plan
    by_prompt = sorted(indices, key=lambda i: (prompt_keys[i], completion_lens[i], i))
    grouped = _pack(by_prompt, prompt_lens, completion_lens, micro_batch_size, token_budget)

    def cost(p: list[list[int]]) -> int:
        return sum(
            len({prompt_keys[i] for i in mb}) * max(prompt_lens[i] for i in mb)
            + len(mb) * max(completion_lens[i] for i in mb)
            for mb in p
        )

    return grouped if cost(grouped) < cost(plan) else plan


def _pack(
    order: list[int],
    prompt_lens: list[int],
    completion_lens: list[int],
    micro_batch_size: int,
    token_budget: int | None,
) -> list[list[int]]:
    """``order`` cut greedily into micro-batches (``length_micro_batches``' size and budget)."""
    out: list[list[int]] = []
    cur: list[int] = []
    max_p = max_c = 0
    for i in order:
        p, c = max(max_p, prompt_lens[i]), max(max_c, completion_lens[i])
        too_many = len(cur) >= micro_batch_size
        too_long = token_budget is not None and (len(cur) + 1) * (p + c) > token_budget
        if cur and (too_many or too_long):
            out.append(cur)
            cur, p, c = [], prompt_lens[i], completion_lens[i]
        cur.append(i)
        max_p, max_c = p, c
    if cur:
        out.append(cur)
    return out
