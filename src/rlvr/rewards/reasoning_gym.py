"""The ``reasoning_gym`` reward: a reasoning-gym task's own scorer (``score_answer``) on the answer
the reply gives between ``<answer>`` and ``</answer>`` (the last such pair; reasoning-gym's own
``extract_answer``). No tags: the scorer gets None (0 for every task we know).

It runs in the sandbox workers (rlvr.rewards.pool), as user functions do: the scorer is another
package's code, so one that raises fails its sample and one that hangs is killed after
``reward.timeout_s``. The row's ``reasoning_gym`` field (rlvr.data.reasoning_gym) names the task,
its config, seed, size and the item's index; the scorer gets the item regenerated from them (its
metadata with the task's own Python types: a JSON copy turns tuples into lists, and some scorers,
arc_agi's, then grade the right answer wrong). Where the regenerated question differs from the
row's (a task whose generator is not reproducible, list_functions), it gets the row's JSON copy.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from rlvr.rewards.base import RewardResult

PREFIX = "reasoning_gym:"
EXTRA_HINT = "data.task=reasoning_gym:... needs the extra: pip install 'rlvr[reasoning-gym]'"
TARGET = "rlvr.rewards.reasoning_gym:score"


def create_dataset(name: str, **kwargs: Any):
    """``reasoning_gym.create_dataset``, with a missing extra, an unknown task or a bad knob
    named as a config error (ValueError)."""
    try:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
    except ImportError as exc:
        raise ValueError(f"{EXTRA_HINT} ({exc})") from exc
    if name not in DATASETS:
        raise ValueError(
            f"data.task={PREFIX}{name}: reasoning-gym has no task {name!r}; "
            f"known: {', '.join(sorted(DATASETS))}"
        )
    try:
        return reasoning_gym.create_dataset(name, **kwargs)
    except (TypeError, ValueError, AssertionError) as exc:
        raise ValueError(
            f"data.task_kwargs for {PREFIX}{name}: {type(exc).__name__}: {exc}"
        ) from exc


@functools.lru_cache(maxsize=16)
def _dataset(name: str, config_json: str, seed: int, size: int):
    return create_dataset(name, seed=seed, size=size, **json.loads(config_json))


def extract(response: str) -> str | None:
    """The reply's answer: the text of its last ``<answer>...</answer>``, stripped, or None."""
    from reasoning_gym.utils import extract_answer

    return extract_answer(response, tag_name="answer")


def score(
    prompt: str,
    response: str,
    reference: str,
    *,
    truncated: bool = False,
    reasoning_gym: dict | None = None,
    **row: Any,
) -> RewardResult:
    """The task's ``score_answer(extracted answer, item)``; info ``correct`` (score 1) and
    ``has_answer`` (the reply had answer tags)."""
    if not isinstance(reasoning_gym, dict):
        raise KeyError(
            "the reasoning_gym reward needs the row field 'reasoning_gym' (rows of "
            f"data.task=reasoning_gym:<task>); the row has {sorted(row)}"
        )
    spec = reasoning_gym
    dataset = _dataset(
        spec["task"], json.dumps(spec["config"], sort_keys=True), spec["seed"], spec["size"]
    )
    entry = dataset[spec["index"]]
    if entry["question"] != spec["entry"]["question"]:
        # a generator that is not reproducible (list_functions draws from the global random
        # module): the row's JSON copy of the item is what is left
        entry = spec["entry"]
    answer = extract(response)
    value = float(dataset.score_answer(answer, entry))
    return RewardResult(
        value, {"correct": float(value >= 1.0), "has_answer": float(answer is not None)}
    )
