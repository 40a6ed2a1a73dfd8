"""verifiers environments a user writes, built from verifiers' own classes on small data (the
hub is not reachable here): `env.name=verifiers:user_verifiers_env` (a ToolEnv with an `add`
tool) and `env.name=verifiers:user_verifiers_env_single` style (load_environment(kind=...))."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def _data(n: int) -> Dataset:
    return Dataset.from_list(
        [{"question": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(n)]
    )


async def exact(completion, answer) -> float:
    """1 when the last assistant message holds the answer; plus a length part, so that a random
    model's group has different rewards."""
    text = ""
    for m in completion:
        if getattr(m, "role", None) == "assistant":
            text = getattr(m, "content", None) or ""
    return float(answer in text) + (len(text) % 3) / 3


def load_environment(kind: str = "tool", n: int = 12, max_turns: int = 3):
    rubric = vf.Rubric(funcs=[exact])
    if kind == "single":
        return vf.SingleTurnEnv(dataset=_data(n), rubric=rubric, system_prompt="Answer briefly.")
    return vf.ToolEnv(dataset=_data(n), tools=[add], max_turns=max_turns, rubric=rubric)
