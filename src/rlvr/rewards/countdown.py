"""Countdown: combine the given numbers with + - * / to reach the target.

Extraction: the content of the last ``<answer>...</answer>`` (TinyZero's format); without
tags, the last line of the response that consists only of digits, ``+ - * / ( )``,
``×``/``÷`` and spaces (so it has no ``=``). Inside tags, a trailing ``= <integer>``
(the model restating the result, as in ``(3+5)*3 = 24``) is dropped before parsing.

Scores (decided here; TinyZero gives 0.1 as a format score):

- 1.0  well-formed, each number taken from ``numbers`` at most as often as it is given,
       and the exact value equals ``target``;
- 0.1  well-formed and the numbers are allowed, but the value is wrong (including
       division by zero);
- 0.0  no equation, malformed (anything the safe parser in ``arith.py`` refuses), or a
       number that is not available (unknown, or used more times than given). Giving
       these 0 rather than 0.1 keeps the format bonus from rewarding made-up numbers.

Using all numbers is not required (OAT's Countdown: "each number can only be used once").
"""

from __future__ import annotations

import operator
import re
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

from rlvr.rewards.arith import (
    MAX_CHARS,
    ArithmeticSyntaxError,
    evaluate,
    literals,
    parse_arithmetic,
)
from rlvr.rewards.base import RewardResult
from rlvr.rewards.extract import last_tag_content

__all__ = ["FORMAT_SCORE", "extract_equation", "grade_countdown"]

FORMAT_SCORE = 0.1
_EQUATION_LINE_RE = re.compile(r"^[\d\s+\-*/()×÷]+$")
_RESULT_SUFFIX_RE = re.compile(r"=\s*-?\d+\s*$")


def extract_equation(response: str) -> tuple[str | None, str]:
    """Return ``(equation, method)`` with method "answer_tag", "last_line" or "none"."""
    if not isinstance(response, str):
        raise TypeError(f"response must be a str, got {type(response).__name__}")
    tagged = last_tag_content(response)
    if tagged is not None:
        if len(tagged) <= MAX_CHARS:  # longer is refused by the parser anyway
            tagged = _RESULT_SUFFIX_RE.sub("", tagged)
        return tagged.strip(), "answer_tag"
    for line in reversed(response.splitlines()):
        line = line.strip()
        if (
            len(line) <= MAX_CHARS
            and _EQUATION_LINE_RE.match(line)
            and any(c.isdigit() for c in line)
        ):
            return line, "last_line"
    return None, "none"


def _as_int(value: object, field: str) -> int:
    try:
        return operator.index(value)  # ints and integer-like (numpy) only, never floats
    except TypeError:
        raise TypeError(f"{field} must hold integers only, got {value!r}") from None


def grade_countdown(response: str, numbers: Sequence[int], target: int) -> RewardResult:
    """Score a Countdown response (see the module docstring for the rules).

    info: correct, has_equation, well_formed, numbers_valid, used_all_numbers,
    division_by_zero, answer_tag (all 0.0/1.0).
    """
    if isinstance(numbers, (str, bytes)) or not isinstance(numbers, Sequence):
        raise TypeError(f"numbers must be a list of integers, got {type(numbers).__name__}")
    available = Counter(_as_int(n, "numbers") for n in numbers)
    goal = Fraction(_as_int(target, "target"))
    equation, method = extract_equation(response)
    info = {
        "correct": 0.0,
        "has_equation": float(equation is not None),
        "well_formed": 0.0,
        "numbers_valid": 0.0,
        "used_all_numbers": 0.0,
        "division_by_zero": 0.0,
        "answer_tag": float(method == "answer_tag"),
    }
    if equation is None:
        return RewardResult(0.0, info)
    try:
        tree = parse_arithmetic(equation.replace("×", "*").replace("÷", "/"))
    except ArithmeticSyntaxError:
        return RewardResult(0.0, info)
    info["well_formed"] = 1.0
    used = Counter(literals(tree))
    if any(count > available[n] for n, count in used.items()):
        return RewardResult(0.0, info)
    info["numbers_valid"] = 1.0
    info["used_all_numbers"] = float(used == available)
    try:
        value = evaluate(tree)
    except ZeroDivisionError:
        info["division_by_zero"] = 1.0
        return RewardResult(FORMAT_SCORE, info)
    if value != goal:
        return RewardResult(FORMAT_SCORE, info)
    info["correct"] = 1.0
    return RewardResult(1.0, info)
