"""How one minibatch is cut into forward/backward passes: by length, token budget or prompt."""

from __future__ import annotations


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
