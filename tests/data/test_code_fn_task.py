"""data.task=code_fn: seeded problems, held-out problems the train split never has, every kind
on both sides, and each row's reference solution passing its tests through the real code reward
(while a reply that only knows the prompt's two examples fails)."""

from __future__ import annotations

import re

import pytest

from rlvr.config import config_from_dict
from rlvr.data.code_tasks import KINDS, code_fn_rows
from rlvr.data.rows import load_rows_for, reward_specs
from rlvr.rewards.runner import RewardRunner
from sandbox_backends import working_backends


def examples(prompt: str) -> list[tuple[str, str]]:
    """The prompt's (argument, value) examples, as the text shows them."""
    shown = prompt.split("For example, ", 1)[1]
    return re.findall(r"f\((.*?)\) returns (.*?)(?= and f\(|\. Reply)", shown)


def problem(row: dict) -> tuple[str, str]:
    return row["code_kind"], row["answer"]  # the kind and its reference: one function to write


def test_held_out_problems_never_appear_in_training_and_cover_every_kind():
    train, held = code_fn_rows(num_train=3000, num_eval=48, seed=3)
    assert len(train) == 3000 and len(held) == 48
    assert {problem(r) for r in train}.isdisjoint({problem(r) for r in held})
    assert len({problem(r) for r in held}) == 48  # distinct held-out problems
    assert {r["code_kind"] for r in held} == set(KINDS) == {r["code_kind"] for r in train}


def test_rows_are_seeded_and_the_held_out_split_ignores_num_train():
    a = code_fn_rows(num_train=20, num_eval=12, seed=5)
    assert a == code_fn_rows(num_train=20, num_eval=12, seed=5)
    assert code_fn_rows(num_train=200, num_eval=12, seed=5)[1] == a[1]
    assert code_fn_rows(num_train=20, num_eval=12, seed=6)[1] != a[1]


def test_prompt_examples_are_the_reference_values_and_not_among_the_tests():
    train, held = code_fn_rows(num_train=50, num_eval=24, seed=0)
    for row in train + held:
        env: dict = {}
        exec(row["answer"], env)
        shown = examples(row["prompt"])
        assert len(shown) == 2, row["prompt"]
        for arg, value in shown:
            assert repr(env["f"](eval(arg))) == value
        calls = [t["call"] for t in row["tests"]]
        assert len(set(calls)) == 5 and not {f"f({a})" for a, _ in shown} & set(calls)
        for t in row["tests"]:
            assert env["f"](eval(t["call"][2:-1])) == t["expected"]


def test_bad_task_kwargs_are_named():
    with pytest.raises(ValueError, match="data.num_eval=200: code_fn holds out at most"):
        code_fn_rows(num_train=1, num_eval=200)
    with pytest.raises(ValueError, match=r"data.task_kwargs.kinds: unknown or empty \['sort'\]"):
        code_fn_rows(num_train=1, num_eval=1, kinds=["add", "sort"])
    train, held = code_fn_rows(num_train=10, num_eval=4, kinds=["add", "repeat"])
    assert {r["code_kind"] for r in train + held} == {"add", "repeat"}


def test_the_task_is_graded_by_the_code_reward_and_references_pass_it():
    cfg = config_from_dict({"data": {"task": "code_fn", "num_train": 8, "num_eval": 24}})
    assert [s.name for s in reward_specs(cfg)] == ["code"]
    train, held = load_rows_for(cfg)
    rows = train + held
    backend = working_backends()[0]
    with RewardRunner([{"name": "code", "kwargs": {"backend": backend}}], timeout_s=20) as r:

        def scores(responses):
            out = r.score_batch(
                [x["prompt"] for x in rows], responses, [""] * len(rows), rows, [False] * len(rows)
            )
            assert out.failures == []
            return out.scores

        assert scores([f"```python\n{x['answer']}```" for x in rows]) == [1.0] * len(rows)
        # a lookup table of the prompt's two examples: right on them, wrong on the tests
        lookup = []
        for x in rows:
            table = ", ".join(f"repr({a}): {v}" for a, v in examples(x["prompt"]))
            lookup.append(f"```python\ndef f(x):\n    return {{{table}}}.get(repr(x))\n```")
        assert sum(scores(lookup)) <= 0.1 * len(rows)
