"""Answer extraction and normalisation, case by case."""

from __future__ import annotations

from fractions import Fraction

import pytest

from rlvr.rewards.extract import extract_answer, harmony_final_text
from rlvr.rewards.normalize import clean_latex, normalize_answer, parse_number


@pytest.mark.parametrize(
    ("text", "answer", "method"),
    [
        (r"so \boxed{\frac{a}{b^{2}}} done", r"\frac{a}{b^{2}}", "boxed"),
        (r"\boxed{1} then \boxed{2} then \boxed{3}", "3", "boxed"),
        (r"\boxed{1} then \fbox{2}", "2", "boxed"),
        (r"\boxed{ 7 }", "7", "boxed"),
        (r"\boxed{5} but \boxed{6", "5", "boxed"),  # the unclosed box is skipped
        (r"\boxed{6", "6", "last_number"),  # no complete box at all
        ("<answer> 3/4 </answer>", "3/4", "answer_tag"),
        ("<answer>1</answer> <answer>2</answer>", "2", "answer_tag"),
        ("<answer>  </answer> it is 9", "9", "last_number"),
        ("work...\n#### 1,234\n", "1,234", "gsm8k"),
        ("#### 5\nlater\n#### 6", "6", "gsm8k"),
        ("We get 3 then 4,500.", "4,500", "last_number"),
        ("1, 2, and 3,", "3", "last_number"),
        ("It is -0.25", "-0.25", "last_number"),
        ("no digits", None, "none"),
        ("", None, "none"),
    ],
)
def test_extract_answer(text: str, answer: str | None, method: str) -> None:
    assert extract_answer(text) == (answer, method)


def test_harmony_markup() -> None:
    final = (
        "<|channel|>analysis<|message|>try \\boxed{1}<|end|>"
        "<|start|>assistant<|channel|>final<|message|>It is \\boxed{2}<|return|>"
    )
    assert harmony_final_text(final) == "It is \\boxed{2}"
    assert extract_answer(final) == ("2", "boxed")
    constrained = '<|channel|>final <|constrain|>json<|message|>{"x": 3}<|end|>'
    assert harmony_final_text(constrained) == '{"x": 3}'
    assert harmony_final_text("<|channel|>analysis<|message|>still thinking") == ""
    assert harmony_final_text("plain text") == "plain text"


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        (r"$5$", "5"),
        (r"\(5\)", "5"),
        (r"$$\frac{1}{2}$$", r"\frac{1}{2}"),
        (r"$5$ or $6$", r"$5$or$6$"),  # two formulas: no delimiter is stripped
        (r"\dfrac{1}{2}", r"\frac{1}{2}"),
        (r"\text{5 cm}", "5"),
        (r"\textbf{\text{12}}", "12"),
        ("1,000", "1000"),
        (r"1{,}000", "1000"),
        ("1, 2, 3", "1,2,3"),  # a list is not a thousands separator
        ("042", "42"),
        ("-007", "-7"),
        ("0.5", "0.5"),
        ("5.", "5"),
        (r"\$5.00", "5.00"),
        ("$5", "5"),  # a lone dollar is a currency sign
        ("x = 5", "5"),
        ("x = y = 5", "x=y=5"),  # two '=': left alone
        (r"50\%", "50"),
        (r"30^\circ", "30"),
        (r"\left(1, 2\right)", "(1,2)"),
        (r"2\pi r", r"2\pi r"),  # the space after a command is kept
        ("12 dollars", "12"),
        ("5m", "5m"),  # a single letter is not taken for a unit
        (r"\text{unclosed", r"\text{unclosed"),
    ],
)
def test_normalize_answer(raw: str, normal: str) -> None:
    assert normalize_answer(raw) == normal


def test_clean_latex_keeps_spaces_for_the_parser() -> None:
    assert clean_latex(r"$x + 1$") == "x + 1"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("12", Fraction(12)),
        ("-0.5", Fraction(-1, 2)),
        (".25", Fraction(1, 4)),
        ("1.5e3", Fraction(1500)),
        ("3/4", Fraction(3, 4)),
        (r"\frac{3}{4}", Fraction(3, 4)),
        (r"-\frac{3}{4}", Fraction(-3, 4)),
        (r"\frac{-3}{4}", Fraction(-3, 4)),
        ("1,000", Fraction(1000)),
        ("1/0", None),  # no zero denominators
        ("1e9999", None),  # exponent capped at three digits: no giant integers
        (r"\sqrt{2}", None),
        ("x", None),
        ("1" * 100, None),  # too long to be a plain number
    ],
)
def test_parse_number(text: str, value: Fraction | None) -> None:
    assert parse_number(text) == value


def test_reference_helpers_for_dataset_solutions() -> None:
    from rlvr.rewards.extract import gsm8k_answer, last_boxed

    assert gsm8k_answer("3 + 4 = <<3+4=7>>7\n#### 7") == "7"
    assert gsm8k_answer("#### 1\nthen\n####  1,250 ") == "1,250"  # the last marker, stripped
    assert gsm8k_answer("no marker 5") is None and gsm8k_answer("#### ") is None
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{3} then \\boxed{4") == "3"  # an unclosed box is skipped
    assert last_boxed("no box") is None
