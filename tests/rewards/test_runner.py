"""RewardRunner: weighted sums, failure containment, hang containment, name resolution."""

from __future__ import annotations

import math
import sys
import textwrap
import time

import pytest
from reward_test_utils import pid_alive, wait_until

from rlvr.rewards.runner import (
    RewardFailureError,
    RewardRunner,
    RewardSpec,
    builtin_reward_names,
    resolve_reward_names,
    validate_reward_spec,
)

USER_MODULE = textwrap.dedent(
    """
    import time
    from rlvr.rewards.base import RewardResult

    BAD = {
        "raise": None,
        "nan": float("nan"),
        "inf": float("inf"),
        "none": None,
        "str": "high",
        "list": [1.0],
        "bad_info": RewardResult(1.0, {"note": "text"}),
    }

    def flaky(prompt, response, reference, *, mode, **row):
        if response != "bad":
            return RewardResult(1.0, {"seen": 1.0})
        if mode == "raise":
            raise ValueError("boom from the user reward")
        if mode == "hang":
            time.sleep(3600)
        return BAD[mode]

    def quarter(prompt, response, reference, **row):
        return 0.25

    def echo_row(prompt, response, reference, **row):
        return RewardResult(float(len(row)), {"truncated_seen": float(row["truncated"]),
                                              "bonus": float(row.get("bonus", 0))})

    NOT_A_FUNCTION = 3
    """
)


@pytest.fixture
def user_module(tmp_path, monkeypatch) -> str:
    """Write the user's reward module into tmp_path and put it on sys.path."""
    name = "my_user_rewards"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def _batch(responses: list[str], references: list[str] | None = None, rows=None):
    n = len(responses)
    return dict(
        prompts=["q"] * n,
        responses=responses,
        references=references or ["0"] * n,
        rows=rows or [{} for _ in range(n)],
        truncated=[False] * n,
    )


def test_builtin_math_is_fast_and_right() -> None:
    with RewardRunner([RewardSpec(name="math")]) as runner:
        responses = [rf"The answer is \boxed{{{i if i % 4 else i + 1}}}" for i in range(64)]
        references = [str(i) for i in range(64)]
        start = time.monotonic()
        out = runner.score_batch(**_batch(responses, references))
        elapsed = time.monotonic() - start
    # every 4th response (i = 0, 4, ..., 60) answers i + 1: 16 wrong, 48 right
    assert out.scores == [0.0 if i % 4 == 0 else 1.0 for i in range(64)]
    assert all(out.valid) and out.failures == []
    metrics = out.metrics()
    assert metrics["correct"] == pytest.approx(48 / 64)
    assert metrics["has_boxed"] == 1.0
    assert metrics["reward_failures"] == 0.0 and metrics["reward_failure_rate"] == 0.0
    assert elapsed < 0.5


@pytest.mark.parametrize("mode", ["raise", "nan", "inf", "none", "str", "list", "bad_info"])
def test_a_bad_return_marks_only_that_sample_invalid(user_module, mode) -> None:
    spec = RewardSpec(name=f"{user_module}:flaky", kwargs={"mode": mode})
    with RewardRunner([spec], num_workers=1) as runner:
        out = runner.score_batch(**_batch(["ok", "bad", "ok", "ok"]))
    assert out.valid == [True, False, True, True]
    assert out.scores == [1.0, 0.0, 1.0, 1.0]
    assert out.infos[1] == {} and out.infos[0] == {"seen": 1.0}
    assert len(out.failures) == 1 and out.failures[0].startswith("sample 1, reward")
    metrics = out.metrics()
    assert metrics["reward_failures"] == 1.0
    assert metrics["reward_failure_rate"] == 0.25  # 1 of 4
    assert metrics["seen"] == 1.0  # averaged over the 3 valid samples only
    if mode == "raise":
        assert "boom from the user reward" in out.failures[0]
        assert "Traceback" in out.failures[0]


def test_a_hang_is_contained_within_the_timeout(user_module) -> None:
    spec = RewardSpec(name=f"{user_module}:flaky", kwargs={"mode": "hang"})
    with RewardRunner([spec], timeout_s=1.0) as runner:
        for worker in runner._pool.workers:  # start-up is not part of the step's budget
            worker.wait_ready()
        start = time.monotonic()
        out = runner.score_batch(**_batch(["ok", "bad", "ok", "ok", "ok", "ok"]))
        elapsed = time.monotonic() - start
        assert elapsed < 1.0 + 1.0
        assert out.valid == [True, False, True, True, True, True]
        assert "timed out" in out.failures[0]
        # the pool recovered: the next batch runs normally
        assert runner.score_batch(**_batch(["ok", "ok"])).scores == [1.0, 1.0]


def test_too_many_failures_stop_the_step(user_module) -> None:
    spec = RewardSpec(name=f"{user_module}:flaky", kwargs={"mode": "raise"})
    with RewardRunner([spec], max_failure_fraction=0.5, num_workers=1) as runner:
        # 2 of 4 = 0.5 is not more than 0.5: allowed
        assert runner.score_batch(**_batch(["bad", "bad", "ok", "ok"])).valid.count(False) == 2
        with pytest.raises(RewardFailureError) as info:
            runner.score_batch(**_batch(["bad", "bad", "bad", "ok"]))  # 3 of 4 > 0.5
    message = str(info.value)
    assert "of 4 completions could not be scored" in message
    assert "Traceback" in message and "boom from the user reward" in message


def test_too_many_hangs_stop_early(user_module) -> None:
    spec = RewardSpec(name=f"{user_module}:flaky", kwargs={"mode": "hang"})
    with RewardRunner([spec], timeout_s=0.5, max_failure_fraction=0.25, num_workers=2) as runner:
        for worker in runner._pool.workers:
            worker.wait_ready()
        start = time.monotonic()
        with pytest.raises(RewardFailureError, match="timed out"):
            runner.score_batch(**_batch(["bad"] * 8))
        # floor(0.25 * 8) = 2 failures allowed; the 3rd ends the batch: two rounds of
        # two parallel timeouts (about 1 s plus restarts), not 8 x 0.5 s = 4 s
        assert time.monotonic() - start < 3.0


def test_weighted_sum_of_two_rewards(user_module) -> None:
    specs = [
        RewardSpec(name="math", weight=1.0),
        RewardSpec(name=f"{user_module}:quarter", weight=0.5),
    ]
    with RewardRunner(specs) as runner:
        out = runner.score_batch(**_batch([r"\boxed{3}", r"\boxed{4}"], ["3", "3"]))
    # right: 1 * 1.0 + 0.5 * 0.25 = 1.125; wrong: 1 * 0.0 + 0.5 * 0.25 = 0.125
    assert out.scores == [1.125, 0.125]
    assert out.infos[0]["reward/math"] == 1.0
    assert out.infos[0][f"reward/{user_module}:quarter"] == 0.25
    assert out.infos[1]["correct"] == 0.0


def test_rows_reach_the_reward_without_clashing_keys(user_module) -> None:
    spec = RewardSpec(name=f"{user_module}:echo_row", kwargs={"bonus": 2})
    rows = [{"prompt": "clash", "answer": "7", "reference": "clash", "numbers": [1]}]
    batch = _batch(["x"], rows=rows) | {"truncated": [True]}
    with RewardRunner([spec], num_workers=1) as runner:
        out = runner.score_batch(**batch)
    # row keys seen: answer, numbers, truncated, bonus = 4 (prompt/reference dropped)
    assert out.scores == [4.0]
    assert out.infos[0] == {"truncated_seen": 1.0, "bonus": 2.0}


def test_countdown_builtin_reads_the_row() -> None:
    rows = [{"numbers": [3, 8, 2, 5], "target": 24}] * 3
    responses = ["<answer>(5 - 2) * 8</answer>", "<answer>8 + 3</answer>", "<answer>8 * 8</answer>"]
    with RewardRunner([RewardSpec(name="countdown")]) as runner:
        out = runner.score_batch(**_batch(responses, ["24"] * 3, rows))
        assert out.scores == [1.0, 0.1, 0.0]  # right; 11 is wrong; 8 used twice
        bad = runner.score_batch(**_batch(["<answer>8*3</answer>"] * 2, ["24"] * 2, [{}, rows[0]]))
    assert bad.valid == [False, True]
    assert "needs row fields ['numbers', 'target']" in bad.failures[0]


def test_close_stops_the_worker_processes(user_module) -> None:
    runner = RewardRunner([RewardSpec(name=f"{user_module}:quarter")], num_workers=2)
    for worker in runner._pool.workers:
        worker.wait_ready()
    pids = [w.pid for w in runner._pool.workers]
    runner.close()
    assert wait_until(lambda: not any(pid_alive(p) for p in pids))


def test_lists_of_different_lengths_are_refused() -> None:
    with RewardRunner([RewardSpec(name="countdown")]) as runner:
        batch = _batch(["a", "b"]) | {"truncated": [False]}
        with pytest.raises(ValueError, match="equal length"):
            runner.score_batch(**batch)


def test_user_function_resolution(user_module) -> None:
    validate_reward_spec(RewardSpec(name=f"{user_module}:quarter"))
    assert resolve_reward_names(["math", f"{user_module}:flaky"]) == [
        "math",
        f"{user_module}:flaky",
    ]
    with pytest.raises(ValueError, match="cannot import module 'no_such_pkg.mod'"):
        RewardRunner([RewardSpec(name="no_such_pkg.mod:f")])
    with pytest.raises(ValueError, match="has no attribute 'missing'"):
        RewardRunner([RewardSpec(name=f"{user_module}:missing")])
    with pytest.raises(ValueError, match="not a function"):
        validate_reward_spec({"name": f"{user_module}:NOT_A_FUNCTION"})


def test_spec_validation_messages() -> None:
    with pytest.raises(ValueError, match=r"'nope'.*built-ins are \['code', 'countdown', 'gsm8k'"):
        validate_reward_spec({"name": "nope"})
    with pytest.raises(ValueError, match=r"'psgrpo'.*missing required kwargs \['prm'\]"):
        validate_reward_spec({"name": "psgrpo"})
    with pytest.raises(ValueError, match=r"unknown kwargs \['colour'\]; accepted: \['symbolic'"):
        validate_reward_spec({"name": "math", "kwargs": {"colour": 1}})
    with pytest.raises(ValueError, match="weight"):
        validate_reward_spec({"name": "math", "weight": math.inf})
    with pytest.raises(ValueError, match="unique"):
        RewardRunner([RewardSpec(name="math"), RewardSpec(name="math")])
    with pytest.raises(ValueError, match="max_failure_fraction"):
        RewardRunner([RewardSpec(name="math")], max_failure_fraction=1.5)
    assert builtin_reward_names() == [
        "code",
        "countdown",
        "gsm8k",
        "math",
        "math_prm",
        "psgrpo",
        "reasoning_gym",
    ]


def test_psgrpo_builtin_with_a_user_prm(tmp_path, monkeypatch) -> None:
    (tmp_path / "my_prm_mod.py").write_text(
        "def steady(prompt, steps):\n    return [0.8] * len(steps)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = RewardSpec(name="psgrpo", kwargs={"prm": "my_prm_mod:steady"})
    response = "Step 1: 2 + 2.\nStep 2: that is 4.\n†Answer: 4"
    with RewardRunner([spec]) as runner:
        out = runner.score_batch(**_batch([response, response], ["4", "5"]))
    # steady scores have no drop moment: right -> 1.0, wrong -> 0.0
    assert out.scores == [1.0, 0.0]
    assert out.infos[0]["step_count"] == 2.0 and out.infos[0]["has_drop_moment"] == 0.0


@pytest.mark.parametrize(
    "name, said",
    [  # a file path (verl's custom_reward_function.path) is answered with its module form
        ("rewards/my_reward.py:score", "did you mean 'rewards.my_reward:score'?"),
        ("my_reward.py:score", "did you mean 'my_reward:score'?"),
        ("./rewards/my_reward.py:score", "did you mean 'rewards.my_reward:score'?"),
        ("maths", "did you mean 'math'?"),  # a built-in's near-miss, not only the list
    ],
)
def test_a_reward_named_like_a_file_or_a_typo_gets_its_spelling(name: str, said: str) -> None:
    with pytest.raises(ValueError) as err:
        validate_reward_spec({"name": name})
    assert said in str(err.value)


def test_a_misspelt_function_gets_the_one_its_module_has(user_module) -> None:
    with pytest.raises(ValueError, match=r"has no attribute 'quartre'.*did you mean 'quarter'\?"):
        validate_reward_spec({"name": f"{user_module}:quartre"})


def test_a_reward_that_overruns_is_told_with_the_knob_that_bounds_it(user_module, capsys) -> None:
    """An LLM judge that takes 6 s fails every call at the 5 s default: the warning said
    'timed out after 5.0 s' without naming reward.timeout_s."""
    spec = RewardSpec(name=f"{user_module}:flaky", kwargs={"mode": "hang"})
    with RewardRunner([spec], timeout_s=0.5) as runner:
        runner.score_batch(**_batch(["ok", "bad"]))
    assert "raise reward.timeout_s (0.5 s)" in capsys.readouterr().err


def test_the_dry_run_says_a_reward_overran_not_that_it_raised(user_module) -> None:
    from rlvr.config import load_config
    from rlvr.training.preflight.dry_run import reward_call_problems

    cfg = load_config(
        None,
        [
            f"reward.specs=[{{name: '{user_module}:flaky', kwargs: {{mode: hang}}}}]",
            "reward.timeout_s=0.5",
        ],
    )
    checks: list[str] = []
    row = {"prompt": "q", "answer": "1", "_source": "train.jsonl:1"}
    with pytest.MonkeyPatch.context() as mp:  # the placeholder reply is the one that hangs
        mp.setattr("rlvr.training.preflight.dry_run.PLACEHOLDER_REPLY", "bad")
        assert reward_call_problems(cfg, row, checks) == []
    assert "raised" not in checks[0]
    assert "took longer than reward.timeout_s=0.5 s" in checks[0], checks
