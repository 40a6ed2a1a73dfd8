"""reasoning-gym's procedural tasks (PyPI ``reasoning-gym``, the extra ``rlvr[reasoning-gym]``)
as single-turn built-in tasks: ``data.task=reasoning_gym:chain_sum``.

``data.task_kwargs`` are the task's own config fields (its difficulty knobs), passed to
``reasoning_gym.create_dataset(name, seed=data.seed, size=..., **task_kwargs)``. The held-out split
takes the first ``data.num_eval`` distinct questions of that seeded sequence; the train split the
following items whose question is not held out (a train question may repeat where the task has
few distinct ones). Each row asks for the final answer in ``<answer> </answer>`` tags (the format
reasoning-gym's own prompts ask for), and carries what its scorer needs under ``reasoning_gym``:
the task, its config, seed, size, the item's index and the item (question, answer, metadata) as
JSON. The reward (rlvr.rewards.reasoning_gym) regenerates the item from them and calls the task's
``score_answer`` on the extracted answer.
"""

from __future__ import annotations

import json

from rlvr.rewards.reasoning_gym import PREFIX, create_dataset

ANSWER_INSTRUCTION = (
    "Give only your final answer between <answer> and </answer> tags, e.g. <answer>42</answer>."
)
# seed and size come from data.seed and the split sizes; a task_kwargs copy would disagree
RESERVED = ("seed", "size")
# how many items past the split sizes are tried before a task is declared too small
TRIES_PER_ROW = 20


def is_reasoning_gym(task: str) -> bool:
    return task.startswith(PREFIX)


def _entry_json(entry: dict) -> dict:
    """The item as JSON values (rows go to samples and checkpoints); a value JSON has no form for
    (gsm_symbolic's Fractions) is written as its str(). The scorer regenerates the item with its
    own types (rlvr.rewards.reasoning_gym), so nothing it reads is lost here."""
    return json.loads(json.dumps(entry, default=str))


def reasoning_gym_rows(
    name: str, *, num_train: int, num_eval: int, seed: int, **task_kwargs
) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows) of reasoning-gym task ``name``; see the module docstring."""
    reserved = sorted(set(task_kwargs) & set(RESERVED))
    if reserved:
        raise ValueError(
            f"data.task_kwargs {reserved} for {PREFIX}{name}: set data.seed and "
            "data.num_train / data.num_eval instead"
        )
    limit = TRIES_PER_ROW * (num_train + num_eval)
    dataset = create_dataset(name, seed=seed, size=limit, **task_kwargs)
    held: list[dict] = []
    train: list[dict] = []
    seen: set[str] = set()
    for index in range(limit):
        if len(train) >= num_train:
            break
        entry = _entry_json(dataset[index])
        question = entry["question"]
        where = {"task": name, "config": dict(task_kwargs), "seed": seed, "size": limit}
        if len(held) < num_eval:
            if question not in seen:
                seen.add(question)
                held.append(_row(where, index, entry))
        elif question not in seen:
            train.append(_row(where, index, entry))
    if len(held) < num_eval or len(train) < num_train:
        raise ValueError(
            f"data.task={PREFIX}{name}: {len(held)} distinct held-out and {len(train)} other "
            f"questions in its first {limit} items, fewer than data.num_eval={num_eval} and "
            f"data.num_train={num_train}: lower them or widen data.task_kwargs"
        )
    return train, held


def _row(where: dict, index: int, entry: dict) -> dict:
    answer = entry.get("answer")
    return {
        "prompt": f"{entry['question']}\n\n{ANSWER_INSTRUCTION}",
        "answer": "" if answer is None else str(answer),
        "reasoning_gym": {**where, "index": index, "entry": entry},
    }
