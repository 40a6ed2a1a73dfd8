"""Hand-written grading cases for rlvr.rewards.math.grade.

Each row is (response, reference, expected correct). The expectation is what a careful
human grader would say; the comment says why when it is not obvious.
"""

from __future__ import annotations

import pytest

from rlvr.rewards.math import grade, reference_answer

HARMONY_FINAL = (
    "<|channel|>analysis<|message|>Maybe it is \\boxed{7}?<|end|>"
    "<|start|>assistant<|channel|>final<|message|>The answer is \\boxed{12}.<|return|>"
)
HARMONY_NO_FINAL = "<|channel|>analysis<|message|>I think \\boxed{12} but let me check"
GSM8K_REFERENCE = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)

EQUIVALENT = [
    # fractions and decimals
    (r"so \boxed{\frac{1}{2}}", "0.5"),
    (r"\boxed{0.5}", r"\frac{1}{2}"),
    (r"\boxed{1/2}", r"\frac{1}{2}"),
    (r"\boxed{\dfrac{1}{2}}", r"\frac{1}{2}"),
    (r"\boxed{\tfrac{3}{4}}", "0.75"),
    (r"\boxed{-\frac{1}{3}}", r"\frac{-1}{3}"),
    (r"\boxed{0.333333}", r"\frac{1}{3}"),  # |0.333333 - 1/3| = 3.3e-7 <= 1e-6
    (r"\boxed{3.0}", "3"),
    (r"\boxed{1.5e3}", "1500"),
    (r"\boxed{.5}", "0.5"),
    # separators, zeros, periods, wrappers
    (r"\boxed{1,000}", "1000"),
    (r"\boxed{1000}", "1,000"),
    (r"\boxed{1{,}000{,}000}", "1000000"),
    (r"\boxed{042}", "42"),
    (r"\boxed{42.}", "42"),
    (r"\boxed{$5$}", "5"),
    (r"The final answer is $\boxed{\(7\)}$", "7"),
    (r"\boxed{\textbf{42}}", "42"),
    (r"\boxed{\mathbf{B}}", "B"),
    (r"\boxed{\text{(B)}}", "(B)"),
    # units and currency
    (r"\boxed{\text{5 cm}}", "5"),
    (r"\boxed{5\text{ cm}}", "5"),
    (r"\boxed{5 \mathrm{cm}^2}", "5"),
    (r"\boxed{\$18}", "18"),
    (r"\boxed{18 \text{ dollars}}", "18"),
    (r"\boxed{30^\circ}", "30"),
    (r"\boxed{50\%}", "50"),
    (r"\boxed{x = 7}", "7"),
    # intervals and sets
    (r"\boxed{[1, 2)}", "[1,2)"),
    (r"\boxed{\left(-\infty, 3\right]}", r"(-\infty, 3]"),
    (r"\boxed{(2, 5)}", r"\left( 2,5 \right)"),
    (r"\boxed{\{3, 1, 2\}}", r"\{1,2,3\}"),  # a set: order does not matter
    # radicals and expressions
    (r"\boxed{\sqrt{8}}", r"2\sqrt{2}"),
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{1}{2}\sqrt{3}"),
    (r"\boxed{\frac{2}{\sqrt{2}}}", r"\sqrt{2}"),
    (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}"),
    (r"\boxed{(x+1)^2}", "x^2+2x+1"),
    (r"\boxed{2\pi}", r"2 \pi"),
    (r"\boxed{2^{2023}}", "2^{2023}"),  # too big for the symbolic stage; equal as strings
    # extraction paths
    (r"First \boxed{3}, finally \boxed{5}", "5"),  # the last box counts
    (r"\fbox{9}", "9"),
    (r"\boxed {11}", "11"),
    (r"\boxed{} so the answer is 4", "4"),  # an empty box is no answer; the last number is
    ("Adding them up gives 48 + 24 = 72.\n#### 72", "72"),
    ("She had 72 clips.", GSM8K_REFERENCE),  # reference is a full GSM8K solution
    ("<answer>3/4</answer>", "0.75"),
    ("The answer is 12", "12"),
    ("The result is -3", "-3"),
    ("x = 5, so y = 10", "10"),
    (HARMONY_FINAL, "12"),
    ("We get 4,500.", "4500"),
    (r"\boxed{7} and then \boxed{8", "7"),  # the unclosed last box (cut off) is skipped
]

WRONG = [
    (r"\boxed{0.51}", "0.5"),
    (r"\boxed{0.50001}", "0.5"),  # differs by 1e-5 > 1e-6
    (r"\boxed{12}", "21"),
    (r"\boxed{1000001}", "1000000"),  # exact comparison: a relative tolerance would pass this
    (r"\boxed{\frac{1}{3}}", "0.33"),
    (r"\boxed{-5}", "5"),
    (r"\boxed{2}", r"\frac{1}{2}"),
    (r"\boxed{12.5}", "125"),
    (r"\boxed{[1,2]}", "[1,2)"),
    (r"\boxed{(1,2)}", "[1,2]"),
    (r"\boxed{\{1,2\}}", r"\{1,2,3\}"),
    (r"\boxed{2\sqrt{3}}", r"3\sqrt{2}"),
    (r"\boxed{x^2+1}", "(x+1)^2"),
    (r"\boxed{5x}", "5"),  # a letter next to a number is a variable, not a unit
    (r"First \boxed{3}, finally \boxed{5}", "3"),
    (r"The answer is 7, i.e. \boxed{8}", "7"),  # a box beats a later-found number
    ("I don't know.", "5"),
    (HARMONY_NO_FINAL, "12"),  # no final channel: the analysis is not graded
    ("<|channel|>analysis<|message|>\\boxed{12}<|end|><|channel|>final<|message|>13", "12"),
    (r"\boxed{}", "0"),
]


@pytest.mark.parametrize(("response", "reference"), EQUIVALENT)
def test_equivalent_answers_are_correct(response: str, reference: str) -> None:
    result = grade(response, reference)
    assert result.score == 1.0, (response, reference, result.info)
    assert result.info["correct"] == 1.0
    assert result.info["grader_timeout"] == 0.0


@pytest.mark.parametrize(("response", "reference"), WRONG)
def test_near_misses_are_wrong(response: str, reference: str) -> None:
    result = grade(response, reference)
    assert result.score == 0.0, (response, reference, result.info)
    assert result.info["correct"] == 0.0


def test_case_count_is_at_least_sixty() -> None:
    assert len(EQUIVALENT) + len(WRONG) >= 60


@pytest.mark.parametrize(
    ("response", "has_answer", "has_boxed", "parse_method"),
    [
        (r"\boxed{3}", 1.0, 1.0, 2.0),
        ("<answer>3</answer>", 1.0, 0.0, 1.0),
        ("#### 3", 1.0, 0.0, 1.0),
        ("it is 3", 1.0, 0.0, 1.0),
        (
            r"\boxed{} so 3",
            1.0,
            1.0,
            1.0,
        ),  # a box was written, but the answer came from the fallback
        ("no idea", 0.0, 0.0, 0.0),
    ],
)
def test_extraction_info(response, has_answer, has_boxed, parse_method) -> None:
    info = grade(response, "3").info
    assert (info["has_answer"], info["has_boxed"], info["parse_method"]) == (
        has_answer,
        has_boxed,
        parse_method,
    )


def test_boxed_in_final_fifth() -> None:
    filler = "x" * 100
    # box at index 0 of a 109-character text: 0 < 0.8 * 109
    assert grade(r"\boxed{5}" + filler, "5").info["boxed_in_final"] == 0.0
    # box at index 100 of a 109-character text: 100 >= 0.8 * 109 = 87.2
    assert grade(filler + r"\boxed{5}", "5").info["boxed_in_final"] == 1.0
    assert grade("5", "5").info["boxed_in_final"] == 0.0


def test_truncated_flag_and_unclosed_box() -> None:
    assert grade(r"\boxed{5}", "5", truncated=True).info["truncated_response"] == 1.0
    assert grade(r"\boxed{5}", "5").info["truncated_response"] == 0.0
    cut = grade(r"\boxed{5} then \boxed{\frac{1}", "5")
    assert cut.info["truncated_response"] == 1.0
    assert cut.score == 1.0


def test_reference_answer_forms() -> None:
    assert reference_answer(GSM8K_REFERENCE) == "72"
    assert reference_answer(r"Thus $x = \boxed{\frac{3}{4}}$.") == r"\frac{3}{4}"
    assert reference_answer("  17 ") == "17"
    assert reference_answer(17) == "17"
    with pytest.raises(TypeError, match="reference"):
        reference_answer(None)  # type: ignore[arg-type]


def test_numeric_only_mode_skips_symbolic() -> None:
    # sqrt(8) = 2 sqrt(2) needs the symbolic stage; with it off the answer is not recognised.
    assert grade(r"\boxed{\sqrt{8}}", r"2\sqrt{2}", symbolic=False).score == 0.0
    assert grade(r"\boxed{1,000}", "1000", symbolic=False).score == 1.0
