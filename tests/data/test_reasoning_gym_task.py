"""reasoning-gym tasks as built-in single-turn tasks: seeded splits with no shared question, rows
that are JSON, and the task's own scorer on the answer between <answer> tags, run in the reward
sandbox (a scorer that raises fails its sample only)."""

from __future__ import annotations

import json
import sys

import pytest
import reasoning_gym

from rlvr.config import load_config
from rlvr.config.eval import EvalSetConfig
from rlvr.data.rows import reward_specs
from rlvr.data.tasks import task_rows
from rlvr.rewards.runner import RewardRunner
from rlvr.training.preflight.checks import config_problems


def score(rows: list[dict], responses: list[str]):
    with RewardRunner(
        [{"name": "reasoning_gym"}], timeout_s=30, max_failure_fraction=1.0
    ) as runner:
        return runner.score_batch(
            [r["prompt"] for r in rows],
            responses,
            [r["answer"] for r in rows],
            rows,
            [False] * len(rows),
        )


def test_splits_are_seeded_disjoint_and_json():
    kwargs = {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2}
    train, held = task_rows("reasoning_gym:chain_sum", num_train=30, num_eval=10, seed=3, **kwargs)
    assert (len(train), len(held)) == (30, 10)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    assert len({r["prompt"] for r in held}) == 10
    again, _ = task_rows("reasoning_gym:chain_sum", num_train=30, num_eval=10, seed=3, **kwargs)
    assert again == train
    other, _ = task_rows("reasoning_gym:chain_sum", num_train=30, num_eval=10, seed=4, **kwargs)
    assert other != train
    assert json.loads(json.dumps(train + held)) == train + held
    for row in train + held:
        a, op, b = row["reasoning_gym"]["entry"]["metadata"]["expression"].split()
        assert row["answer"] == str(int(a) + int(b) if op == "+" else int(a) - int(b))
        assert 10 <= int(a) <= 99 and row["prompt"].endswith(
            "</answer> tags, e.g. <answer>42</answer>."
        )
    # the item is the one reasoning-gym makes at that seed and index
    spec = held[0]["reasoning_gym"]
    ds = reasoning_gym.create_dataset("chain_sum", seed=3, size=spec["size"], **kwargs)
    assert ds[spec["index"]]["question"] == spec["entry"]["question"]


def test_the_tasks_scorer_grades_the_tagged_answer():
    _, rows = task_rows("reasoning_gym:chain_sum", num_train=1, num_eval=4, seed=0)
    right = rows[0]["answer"]
    out = score(
        rows,
        [
            f"thinking... <answer>{int(right) + 1}</answer> no, <answer> {right} </answer>",
            f"The answer is {rows[1]['answer']}",  # no tags: the scorer gets None
            f"<answer>{int(rows[2]['answer']) + 1}</answer>",
            f"<answer>{rows[3]['answer']}</answer>",
        ],
    )
    assert out.valid == [True] * 4
    assert out.scores == [1.0, 0.0, 0.0, 1.0]
    assert [i["has_answer"] for i in out.infos] == [1.0, 0.0, 1.0, 1.0]
    assert [i["correct"] for i in out.infos] == [1.0, 0.0, 0.0, 1.0]


def test_the_scorer_sees_the_tasks_own_types():
    """arc_agi's grids are tuples: a JSON copy of the item (lists) grades the right answer 0."""
    _, rows = task_rows("reasoning_gym:arc_agi", num_train=1, num_eval=2, seed=1)
    out = score(rows, [f"<answer>{r['answer']}</answer>" for r in rows])
    assert out.scores == [1.0, 1.0]


def test_a_scorer_that_raises_fails_its_sample_only():
    _, rows = task_rows("reasoning_gym:chain_sum", num_train=1, num_eval=3, seed=0)
    broken = json.loads(json.dumps(rows))
    broken[1]["reasoning_gym"]["task"] = "no_such_task"
    del broken[2]["reasoning_gym"]
    out = score(broken, [f"<answer>{r['answer']}</answer>" for r in rows])
    assert out.valid == [True, False, False] and out.scores == [1.0, 0.0, 0.0]
    assert "has no task 'no_such_task'" in out.failures[0]
    assert "needs the row field" in out.failures[1]


def test_an_item_that_does_not_regenerate_is_scored_from_the_row():
    """list_functions draws from the global random module: its item 0 differs between two
    datasets of one seed; the row's JSON copy grades it."""
    _, rows = task_rows("reasoning_gym:list_functions", num_train=1, num_eval=3, seed=0)
    spec = rows[0]["reasoning_gym"]
    again = reasoning_gym.create_dataset("list_functions", seed=0, size=spec["size"])
    assert again[spec["index"]]["question"] != spec["entry"]["question"]
    right = [f"<answer>{r['answer']}</answer>" for r in rows]
    assert score(rows, right).scores == [1.0, 1.0, 1.0]
    assert score(rows, ["<answer>[]</answer>"] * 3).scores == [0.0, 0.0, 0.0]


def test_metadata_without_a_json_form_is_kept_as_text():
    """gsm_symbolic's metadata holds Fractions: the row has their str(), the scorer the item."""
    _, rows = task_rows("reasoning_gym:gsm_symbolic", num_train=1, num_eval=8, seed=0)
    assert json.loads(json.dumps(rows)) == rows
    assert score(rows, [f"<answer>{r['answer']}</answer>" for r in rows]).scores == [1.0] * 8


def test_config_reward_and_errors_name_the_knob():
    cfg = load_config(None, ["data.task=reasoning_gym:chain_sum"])
    assert config_problems(cfg) == []
    assert [s.name for s in reward_specs(cfg)] == ["reasoning_gym"]
    # an eval set of a reasoning-gym task is graded by its scorer, whatever the run trains on
    assert EvalSetConfig(name="c", task="reasoning_gym:chain_sum").resolved().grader == (
        "reasoning_gym"
    )
    assert EvalSetConfig(name="c", task="arithmetic").resolved().grader is None
    with pytest.raises(ValueError, match="reasoning-gym has no task 'no_such_task'"):
        task_rows("reasoning_gym:no_such_task", num_train=1, num_eval=1, seed=0)
    with pytest.raises(
        ValueError, match=r"data.task_kwargs for reasoning_gym:chain_sum: TypeError"
    ):
        task_rows("reasoning_gym:chain_sum", num_train=1, num_eval=1, seed=0, digits=3)
    with pytest.raises(ValueError, match=r"data.task_kwargs \['size'\]"):
        task_rows("reasoning_gym:chain_sum", num_train=1, num_eval=1, seed=0, size=9)
    # two one-digit terms, + or -: 200 questions, not 250 distinct held-out ones
    tiny = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    with pytest.raises(ValueError, match="200 distinct held-out .* fewer than data.num_eval=250"):
        task_rows("reasoning_gym:chain_sum", num_train=5, num_eval=250, seed=0, **tiny)
    with pytest.raises(ValueError, match="takes no kwargs"):
        RewardRunner([{"name": "reasoning_gym", "kwargs": {"tag": "final"}}])


def test_missing_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(ValueError, match=r"rlvr\[reasoning-gym\]"):
        task_rows("reasoning_gym:chain_sum", num_train=1, num_eval=1, seed=0)
