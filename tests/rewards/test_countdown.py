"""Countdown grading and the safe arithmetic parser, with values worked by hand."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.rewards.arith import ArithmeticSyntaxError, evaluate, literals, parse_arithmetic
from rlvr.rewards.countdown import FORMAT_SCORE, extract_equation, grade_countdown

NUMBERS = [3, 8, 2, 5]
TARGET = 24


@pytest.mark.parametrize(
    ("response", "score"),
    [
        ("<answer>8 * 3</answer>", 1.0),  # 24; not every number has to be used
        ("<answer>(5 - 2) * 8</answer>", 1.0),  # 3 * 8 = 24
        ("<answer>(5 - 2) * 8 = 24</answer>", 1.0),  # a restated result is dropped
        ("<answer>8 × 3</answer>", 1.0),
        ("<answer>(8 + 2 + 5) + 3 * 3</answer>", 0.0),  # 3 used twice, given once
        ("<answer>8 + 3 + 2 + 5</answer>", FORMAT_SCORE),  # 18: well formed, wrong
        ("<answer>8 + 8 + 8</answer>", 0.0),  # 24, but 8 is used three times
        ("<answer>24</answer>", 0.0),  # 24 is not one of the numbers
        ("<answer>12 * 2</answer>", 0.0),  # 12 is not one of the numbers
        ("<answer>(8 * 3</answer>", 0.0),  # unbalanced
        ("<answer>8 ** 3</answer>", 0.0),  # no power operator
        ("<answer>-3 + 27</answer>", 0.0),  # no unary minus
        ("<answer>2.5 * 8</answer>", 0.0),  # integers only
        ("<answer>8 x 3</answer>", 0.0),
        ("<answer></answer>", 0.0),
        ("I could not find one.", 0.0),
        ("Let me try.\n(5 - 2) * 8\n", 1.0),  # no tags: the last arithmetic line
        ("8 + 3\n(5 - 2) * 8 = 24", FORMAT_SCORE),  # the '=' line is skipped; 8 + 3 = 11
        ("<answer>8 * 3</answer> and later <answer>8 + 5</answer>", FORMAT_SCORE),  # last tag
    ],
)
def test_countdown_scores(response: str, score: float) -> None:
    assert grade_countdown(response, NUMBERS, TARGET).score == score


def test_exact_rational_arithmetic() -> None:
    # 6 / (1 - 3/4) = 6 / (1/4) = 24: needs exact fractions, 3/4 is not an integer
    result = grade_countdown("<answer>6 / (1 - 3 / 4)</answer>", [1, 3, 4, 6], 24)
    assert result.score == 1.0
    assert result.info["used_all_numbers"] == 1.0


def test_repeated_numbers_may_each_be_used_once() -> None:
    assert grade_countdown("<answer>4 * 4 + 6</answer>", [4, 4, 6], 22).score == 1.0  # 16 + 6
    assert grade_countdown("<answer>4 * 4 * 4</answer>", [4, 4, 6], 64).score == 0.0


def test_division_by_zero_is_well_formed_but_wrong() -> None:
    result = grade_countdown("<answer>8 / (5 - 5)</answer>", [8, 5, 5], 8)
    assert result.score == FORMAT_SCORE
    assert result.info["division_by_zero"] == 1.0
    assert result.info["numbers_valid"] == 1.0


def test_info_fields() -> None:
    info = grade_countdown("<answer>8 * 3</answer>", NUMBERS, TARGET).info
    assert info == {
        "correct": 1.0,
        "has_equation": 1.0,
        "well_formed": 1.0,
        "numbers_valid": 1.0,
        "used_all_numbers": 0.0,  # 2 and 5 unused
        "division_by_zero": 0.0,
        "answer_tag": 1.0,
    }


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(TypeError, match="target"):
        grade_countdown("<answer>8*3</answer>", NUMBERS, 24.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="numbers"):
        grade_countdown("<answer>8*3</answer>", [3, "8"], 24)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="numbers"):
        grade_countdown("<answer>8*3</answer>", "3 8", 24)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2 + 3 * 4", 14),  # * binds tighter: 2 + 12
        ("(2 + 3) * 4", 20),
        ("8 - 3 - 2", 3),  # left associative: (8 - 3) - 2
        ("8 / 4 / 2", 1),  # (8 / 4) / 2
        ("7 / 2", Fraction(7, 2)),
        ("((((1))))", 1),
    ],
)
def test_parser_precedence_and_associativity(text: str, value: Fraction) -> None:
    assert evaluate(parse_arithmetic(text)) == value


@pytest.mark.parametrize(
    "text",
    ["", "1 +", "(1", "1)", "1 2", "+1", "1 ^ 2", "1 % 2", "a + 1", "1_000", "1e3"],
)
def test_parser_rejects(text: str) -> None:
    with pytest.raises(ArithmeticSyntaxError):
        parse_arithmetic(text)


def test_parser_limits_are_fast() -> None:
    start = time.monotonic()
    with pytest.raises(ArithmeticSyntaxError, match="nested"):
        parse_arithmetic("(" * 60 + "3" + ")" * 60)
    with pytest.raises(ArithmeticSyntaxError, match="longer"):
        parse_arithmetic("1+" * 600 + "1")
    with pytest.raises(ArithmeticSyntaxError, match="digits"):
        parse_arithmetic("9" * 13)
    long_line = "1+" * 50_000 + "1"
    assert grade_countdown(f"<answer>{long_line}</answer>", [1], 2).score == 0.0
    assert grade_countdown(long_line + "\n", [1], 2).score == 0.0
    assert time.monotonic() - start < 1.0


def test_extract_equation_methods() -> None:
    assert extract_equation("<answer> 1 + 2 </answer>") == ("1 + 2", "answer_tag")
    assert extract_equation("think\n1 + 2\nso that is it.") == ("1 + 2", "last_line")
    assert extract_equation("no maths here") == (None, "none")


# Property: a fully parenthesised expression over the given numbers evaluates (by our
# parser) to the value the test computes directly on the same structure.
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@settings(max_examples=60, deadline=None)
@given(
    numbers=st.lists(st.integers(1, 99), min_size=2, max_size=5),
    ops=st.lists(st.sampled_from(sorted(_OPS) + ["/"]), min_size=4, max_size=4),
)
def test_left_fold_expression_hits_its_own_value(numbers: list[int], ops: list[str]) -> None:
    text, value = str(numbers[0]), Fraction(numbers[0])
    for number, op in zip(numbers[1:], ops, strict=False):
        text = f"({text} {op} {number})"
        value = value / number if op == "/" else _OPS[op](value, Fraction(number))
    tree = parse_arithmetic(text)
    assert literals(tree) == numbers
    assert evaluate(tree) == value
    if value.denominator == 1:
        assert grade_countdown(f"<answer>{text}</answer>", numbers, int(value)).score == 1.0
    assert grade_countdown(f"<answer>{text}</answer>", numbers, int(value) + 1).score != 1.0
