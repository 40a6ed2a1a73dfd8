"""Hostile responses: they must be graded quickly, score 0 and never run as code."""

from __future__ import annotations

import threading
import time

import pytest

from rlvr.rewards import symbolic
from rlvr.rewards.countdown import grade_countdown
from rlvr.rewards.extract import extract_answer
from rlvr.rewards.guards import symbolic_guard
from rlvr.rewards.math import grade

# Each of these hangs or exhausts memory if sympy is asked to evaluate it.
HUGE = [
    r"\boxed{9^{9^{9^{9}}}}",
    r"\boxed{10^{10^{10}}}",
    r"\boxed{10**10**10}",
    r"\boxed{2^{100000000}}",
    r"\boxed{x^{9^{99}}}",
    r"\boxed{(x+1)^{1000}}",  # sympy needs seconds to expand this
    r"\boxed{1000000!}",
    r"\boxed{(10!)!}",
]


@pytest.mark.parametrize("response", HUGE)
def test_huge_exponents_are_refused_fast(response: str) -> None:
    start = time.monotonic()
    result = grade(response, "5")
    assert time.monotonic() - start < 1.0
    assert result.score == 0.0
    assert result.info["grader_timeout"] == 1.0


def test_guard_lets_ordinary_answers_through() -> None:
    for answer in [
        r"2^{10}",
        r"x^{2}+1",
        r"e^{-x^2}",
        r"(n+1)!",
        r"5!",
        r"10^{-6}",
        r"\sqrt[3]{2}",
    ]:
        assert symbolic_guard(answer) is None, answer


def test_ten_thousand_nested_braces() -> None:
    response = r"\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}"
    start = time.monotonic()
    answer, method = extract_answer(response)
    result = grade(response, "1")
    assert time.monotonic() - start < 1.0
    assert method == "boxed" and answer is not None and len(answer) == 20_001
    assert result.score == 0.0  # 20k characters of braces is not an answer
    unbalanced = grade(r"\boxed{" + "{" * 10_000 + "1", "1")
    assert unbalanced.info["truncated_response"] == 1.0


def test_one_megabyte_of_text() -> None:
    words = "lorem ipsum " * 87_000  # 1,044,000 characters
    start = time.monotonic()
    right = grade(words + r"\boxed{7}", "7")
    digits = grade("1" * 1_000_000, "1")  # the "last number" is a million digits long
    assert time.monotonic() - start < 2.0
    assert right.score == 1.0
    assert digits.score == 0.0 and digits.info["grader_timeout"] == 1.0


def test_python_code_in_a_box_is_not_executed(canary) -> None:
    code = f"__import__('os').system('touch {canary}')"
    result = grade(rf"\boxed{{{code}}}", "0")
    assert result.score == 0.0
    assert result.info["grader_timeout"] == 1.0  # refused by the guard before any parser
    # The second line of defence: even past the guard, the symbolic checker only parses LaTeX.
    assert symbolic.symbolic_equal("0", code, timeout_s=10) is False
    assert (
        symbolic.symbolic_equal("0", "eval(\"__import__('os').system('touch CANARY')\")", 10)
        is False
    )
    assert not canary.exists()


def test_python_code_in_a_countdown_equation_is_not_executed(canary) -> None:
    code = f"__import__('os').system('touch {canary}')"
    for response in [f"<answer>{code}</answer>", f"<answer>(1+2)*{code}</answer>", code]:
        result = grade_countdown(response, [1, 2, 3], 6)
        assert result.score == 0.0
        assert result.info["well_formed"] == 0.0
    assert not canary.exists()


def test_grading_from_a_worker_thread() -> None:
    """math-verify's own timeout needs the main thread; ours must work from any thread."""
    results: list[float] = []
    thread = threading.Thread(
        target=lambda: results.append(grade(r"\boxed{\sqrt{18}}", r"3\sqrt{2}").score)
    )
    thread.start()
    thread.join(timeout=60)
    assert results == [1.0]


SLOW_MODULE = """
import time

def slow_verify(gold, pred, soft_timeout_s):
    time.sleep(60)
    return True
"""


def test_symbolic_stage_is_killed_at_its_time_limit(tmp_path, monkeypatch) -> None:
    """An answer that passes the guards but hangs the checker still returns in time."""
    (tmp_path / "slow_checker_mod.py").write_text(SLOW_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    symbolic.shutdown()  # the next worker inherits the new sys.path
    monkeypatch.setattr(symbolic, "_TARGET", "slow_checker_mod:slow_verify")
    symbolic.warm_up()
    symbolic._get_worker().wait_ready()  # start-up time is not part of the per-answer limit
    start = time.monotonic()
    result = grade(r"\boxed{\sqrt{50}}", r"5\sqrt{2}", timeout_s=0.5)
    elapsed = time.monotonic() - start
    assert result.score == 0.0 and result.info["grader_timeout"] == 1.0
    assert elapsed < 0.5 + 1.0
    monkeypatch.undo()
    symbolic.shutdown()
    # A fresh worker with the real checker grades the same pair (timeouts are not cached).
    assert grade(r"\boxed{\sqrt{50}}", r"5\sqrt{2}").score == 1.0


@pytest.mark.parametrize(
    "response",
    [
        "<answer>" * 125_000,  # 1 MB of unclosed tags: a lazy regex would rescan each time
        "<|channel|>final" * 60_000,  # Harmony headers that never reach <|message|>
        "\\boxed" + " " * 1_000_000,  # a box command followed by a megabyte of spaces
        "#" * 1_000_000,
        "=1" * 500_000,
    ],
)
def test_megabyte_patterns_stay_linear(response: str) -> None:
    start = time.monotonic()
    math_result = grade(response, "2")
    countdown_result = grade_countdown(response, [1, 2], 3)
    assert time.monotonic() - start < 2.0
    assert math_result.score == 0.0 and countdown_result.score == 0.0
