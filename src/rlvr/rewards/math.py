"""Grade a maths answer: extract, normalise, then compare as strings, numbers, expressions.

``grade(response, reference)`` returns score 1.0 when the extracted answer equals the
reference and 0.0 otherwise, with diagnostics in ``info`` (all floats):

- ``correct``            1.0 / 0.0 (same as the score)
- ``has_answer``         an answer was extracted
- ``has_boxed``          the (final part of the) response contains ``\\boxed``/``\\fbox``
- ``parse_method``       2 boxed, 1 fallback (answer tag, ``####``, last number), 0 none
- ``boxed_in_final``     the last box starts within the final 20% of the text
- ``truncated_response`` the caller says generation hit its length limit, or the last box
  never closes
- ``grader_timeout``     the answer was refused as pathological (see ``guards.py``) or the
  symbolic check ran out of time; it is graded wrong, never stalls the step

The comparison cascade, cheapest first: normalised strings equal; both plain numbers
and equal within 1e-6 (exact fractions, so 1000000 vs 1000001 is wrong); otherwise
math-verify in a sandbox process (fractions, radicals, intervals, sets, equivalent
expressions). Model output is never evaluated as code.
"""

from __future__ import annotations

import numbers
from fractions import Fraction

from rlvr.rewards.base import RewardResult
from rlvr.rewards.extract import extract_answer, extract_details
from rlvr.rewards.guards import symbolic_guard
from rlvr.rewards.normalize import clean_latex, normalize_answer, parse_number
from rlvr.rewards.symbolic import SymbolicTimeout, symbolic_equal

__all__ = ["answers_match", "extract_answer", "grade", "reference_answer"]

NUMERIC_TOLERANCE = Fraction(1, 10**6)
DEFAULT_SYMBOLIC_TIMEOUT_S = 2.0
# An extracted answer longer than this is not an answer; it is refused unread.
MAX_ANSWER_CHARS = 1000
BOXED_FINAL_FRACTION = 0.8
_PARSE_METHOD = {"boxed": 2.0, "answer_tag": 1.0, "gsm8k": 1.0, "last_number": 1.0, "none": 0.0}


def reference_answer(reference: str | int | float) -> str:
    """The answer inside a reference: after the last ``####`` (a GSM8K solution), else the
    last box (a MATH solution), else the whole reference."""
    if isinstance(reference, numbers.Real) and not isinstance(reference, bool):
        return str(reference)
    if not isinstance(reference, str):
        raise TypeError(f"reference must be a str or a number, got {type(reference).__name__}")
    if "####" in reference:
        return reference.rsplit("####", 1)[1].strip()
    found = extract_details(reference)
    if found.method == "boxed":
        return found.answer or ""
    return reference.strip()


def answers_match(
    pred: str, ref: str, *, symbolic: bool = True, timeout_s: float = DEFAULT_SYMBOLIC_TIMEOUT_S
) -> tuple[bool, bool]:
    """Compare two extracted answers; returns ``(correct, refused_or_timed_out)``."""
    if len(pred) > MAX_ANSWER_CHARS:
        return False, True
    pred_norm, ref_norm = normalize_answer(pred), normalize_answer(ref)
    if pred_norm and pred_norm == ref_norm:
        return True, False
    pred_num, ref_num = parse_number(pred_norm), parse_number(ref_norm)
    if pred_num is not None and ref_num is not None:
        return abs(pred_num - ref_num) <= NUMERIC_TOLERANCE, False
    if not symbolic or not pred_norm or not ref_norm:
        return False, False
    pred_latex, ref_latex = clean_latex(pred), clean_latex(ref)
    if symbolic_guard(pred_latex) is not None or symbolic_guard(ref_latex) is not None:
        return False, True
    try:
        return symbolic_equal(ref_latex, pred_latex, timeout_s), False
    except SymbolicTimeout:
        return False, True


def grade(
    response: str,
    reference: str | int | float,
    *,
    truncated: bool = False,
    symbolic: bool = True,
    timeout_s: float = DEFAULT_SYMBOLIC_TIMEOUT_S,
) -> RewardResult:
    """Score ``response`` against ``reference`` (1.0 right, 0.0 wrong); see the module docstring.

    ``symbolic=False`` stops after the string and numeric comparisons (enough for integer
    answers such as GSM8K's). ``timeout_s`` bounds the symbolic check of this one answer.
    """
    found = extract_details(response)
    ref = reference_answer(reference)
    correct, refused = False, False
    if found.answer is not None and ref:
        correct, refused = answers_match(found.answer, ref, symbolic=symbolic, timeout_s=timeout_s)
    text_len = len(found.text)
    box_in_final = found.box_start >= 0 and found.box_start >= BOXED_FINAL_FRACTION * text_len
    info = {
        "correct": float(correct),
        "has_answer": float(found.answer is not None),
        "has_boxed": float(found.box_start >= 0),
        "parse_method": _PARSE_METHOD[found.method],
        "boxed_in_final": float(box_in_final),
        "truncated_response": float(bool(truncated) or found.unclosed_box),
        "grader_timeout": float(refused),
    }
    return RewardResult(score=float(correct), info=info)
