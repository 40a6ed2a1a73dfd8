"""The code reward, run for real: the model's program in every sandbox backend that works here,
through the batch runner the trainer uses (RewardRunner), graded against assert, call and
stdin/stdout tests; containment of a hang, a crash, a flood; the tricks that fake a pass."""

from __future__ import annotations

import time

import pytest

from rlvr.config import config_from_dict
from rlvr.rewards.code import extract_program, normalise_output, parse_tests, program_of
from rlvr.rewards.runner import RewardFailureError, RewardRunner
from rlvr.sandbox.select import UNSAFE
from rlvr.training.preflight.checks import config_problems
from sandbox_backends import working_backends

ALL = working_backends()


@pytest.fixture(params=ALL)
def runner(request):
    """A factory of runners whose only reward is ``code`` on one backend."""
    made = []

    def make(timeout_s: float = 10.0, **kwargs):
        r = RewardRunner(
            [{"name": "code", "kwargs": {"backend": request.param, **kwargs}}],
            timeout_s=timeout_s,
        )
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def score(r, responses, rows):
    return r.score_batch(
        ["p"] * len(responses), responses, [""] * len(responses), rows, [False] * len(responses)
    )


def fenced(code: str) -> str:
    return f"Here it is:\n```python\n{code}\n```\nDone."


# a row with one test of each kind: f doubles, the script prints double its input
ROW = {
    "tests": [
        "assert f(3) == 6",
        {"call": "f(-2)", "expected": -4},
        {"call": "f([1, 3])", "expected": [2, 6]},
        {"stdin": "5\n", "stdout": "10\n"},
    ]
}
GOOD = """import sys
def f(x):
    return [v * 2 for v in x] if isinstance(x, list) else x * 2
if __name__ == "__main__":
    print(f(int(sys.stdin.read())))"""


def test_extract_program_takes_the_last_python_or_bare_block():
    text = "```python\na = 1\n```\ntext\n```bash\nls\n```\n```\nb = 2\n```\n```py\nc = 3\n```"
    assert extract_program(text) == "c = 3\n"
    assert extract_program("```js\nx\n```") is None
    assert extract_program("```python\nunclosed = 1\n") is None
    assert extract_program("no code") is None


def test_program_of_puts_the_prefix_before_a_block_or_a_completion():
    prefix = 'def g(x):\n    """doc"""\n'
    assert program_of(fenced("def g(x): return 1"), prefix) == prefix + "\ndef g(x): return 1\n"
    assert program_of("    return 1\n", prefix) == prefix + "    return 1\n"
    assert program_of("no block", None) is None


def test_output_normalisation_drops_trailing_space_and_blank_lines_only():
    assert normalise_output("a  \r\n b\n\n\n") == "a\n b"
    assert normalise_output("a\n\nb") != normalise_output("a\nb")  # inner blank lines count
    assert normalise_output(" a") != normalise_output("a")  # leading spaces count


def test_bad_tests_are_named_by_field_and_item():
    with pytest.raises(ValueError, match="row field 'tests' must be a list"):
        parse_tests("assert True")
    with pytest.raises(ValueError, match=r"'tests\[1\]' has keys \['input', 'output'\]"):
        parse_tests(["assert True", {"input": "1", "output": "2"}])
    with pytest.raises(ValueError, match=r"'tests\[0\]'.expected is not JSON"):
        parse_tests([{"call": "f()", "expected": {1, 2}}])
    with pytest.raises(ValueError, match=r"'tests\[0\]'.call must be a non-empty string"):
        parse_tests([{"call": " ", "expected": 1}])


def test_a_right_program_passes_every_kind_of_test(runner):
    r = runner()
    out = score(r, [fenced(GOOD)], [ROW])
    assert out.valid == [True]
    assert out.scores == [1.0], out
    assert out.infos[0]["correct"] == 1.0 and out.infos[0]["code_pass_frac"] == 1.0


def test_all_or_nothing_by_default_and_the_fraction_as_an_option(runner):
    # right on ints, wrong on lists and on the script: 2 of 4 tests pass
    half = "def f(x):\n    return x * 2"
    assert score(runner(), [fenced(half)], [ROW]).scores == [0.0]
    out = score(runner(fraction=True), [fenced(half)], [ROW])
    assert out.scores == [0.5] and out.infos[0]["correct"] == 0.0


def test_no_program_scores_zero_and_says_so(runner):
    out = score(runner(), ["f(x) = 2x", "```js\nlet f = x => 2*x\n```"], [ROW, ROW])
    assert out.scores == [0.0, 0.0] and out.valid == [True, True]
    assert [i["code_no_program"] for i in out.infos] == [1.0, 1.0]


def test_a_row_without_tests_fails_naming_the_field(runner):
    with pytest.raises(RewardFailureError, match="the row has no field 'tests'"):
        score(runner(), [fenced(GOOD)], [{"answer": "x"}])


@pytest.mark.parametrize(
    "cheat",
    [
        "exit(0)",  # ends the program before any test runs
        "import os\nos._exit(0)",
        # an object equal to everything: call tests compare JSON text outside the sandbox
        "class A:\n    __eq__ = lambda s, o: True\ndef f(x):\n    return A()",
        # reports of its own: without the marker they are the program's output, nothing more
        "print('[0, true, \"\"]')\nimport json\nfor i in range(3):\n"
        "    print('x', json.dumps([i, True, '[1, 1]']))\nimport os\nos._exit(0)",
    ],
    ids=["exit", "os_exit", "always_equal", "own_reports"],
)
def test_tricks_that_fake_a_pass_score_zero(runner, cheat):
    row = {"tests": [{"call": "f(-2)", "expected": -4}, {"call": "f([1])", "expected": [1, 1]}]}
    out = score(runner(fraction=True), [fenced(cheat)], [row])
    assert out.scores == [0.0], out


def test_a_hang_a_crash_and_a_flood_mark_only_their_own_sample(runner):
    r = runner(timeout_s=6.0)  # each sample's runs share 3 s (half the runner's limit)
    responses = [
        fenced(GOOD),
        fenced("def f(x):\n    while True:\n        pass"),
        fenced(GOOD),
        fenced("import ctypes\nctypes.string_at(0)"),  # segfault while loading
        fenced("def f(x):\n    print('y' * 10**7)\n    return x * 2"),
        fenced("syntax error here"),
    ]
    start = time.monotonic()
    out = score(r, responses, [ROW] * len(responses))
    elapsed = time.monotonic() - start
    assert out.valid == [True] * 6 and out.failures == []
    assert out.scores == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    hang, crash, flood, syntax = (out.infos[i] for i in (1, 3, 4, 5))
    assert hang["code_timeout"] == 1.0
    assert crash["code_error"] == 1.0 and crash["code_timeout"] == 0.0
    assert flood["code_limit"] == 1.0  # the output cut: its reports are lost, not forged
    assert syntax["code_error"] == 1.0
    assert elapsed < 3.0 + 5 * 1.5, elapsed  # the hang cost its own share, not the batch's


def test_the_sample_budget_is_shared_so_a_hang_never_exceeds_it(runner):
    # five script tests, each would hang: the runs split the sample's time, and it ends in time
    r = runner(timeout_s=4.0)
    row = {"tests": [{"stdin": str(i), "stdout": str(i)} for i in range(5)]}
    start = time.monotonic()
    out = score(r, [fenced("while True:\n    pass")], [row])
    assert out.valid == [True] and out.scores == [0.0] and out.infos[0]["code_timeout"] == 1.0
    assert time.monotonic() - start < 2.0 + 1.5


def test_config_check_refuses_the_code_reward_without_a_sandbox(monkeypatch):
    from rlvr.sandbox import select

    # a machine where no local backend works: auto finds none
    monkeypatch.setattr(select, "LOCAL_BACKENDS", {"bwrap": "no_such_module_xyz:Box"})
    monkeypatch.setattr(select, "_cache", {})  # the real probes come back after the test
    monkeypatch.setattr(select, "_failures", {})

    def problems(**cfg):
        return [p for p in config_problems(config_from_dict(cfg)) if "sandbox" in p]

    # the code_fn task's own reward, an explicit spec, and humaneval's grader
    for cfg in (
        {"data": {"task": "code_fn"}},
        {"reward": {"specs": [{"name": "code"}]}},
        {"eval": {"sets": [{"name": "humaneval"}]}},
    ):
        assert config_problems(config_from_dict({**cfg, "sandbox": {"backend": UNSAFE}})) == []
        found = problems(**cfg)
        assert len(found) == 1, found
        assert "the code reward" in found[0] and "sandbox.backend=auto" in found[0]
        assert "unsafe_local" in found[0]  # the message names the way out, and that it is unsafe
    assert problems(data={"task": "arithmetic"}) == []  # no code reward: no check
