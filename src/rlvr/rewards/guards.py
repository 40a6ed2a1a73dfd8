"""Refuse answers that would make a computer-algebra system hang or exhaust memory.

sympy evaluates integer powers and factorials exactly: ``9^{9^{9^{9}}}`` or
``10^{10^{10}}`` would run until killed. These checks run on the answer text before it is
handed to the symbolic checker; they are the first line of defence (the second is the
hard time limit of the worker process, see ``sandbox.py``).

The rules are conservative on purpose: a rare legitimate answer such as ``2^{2^{2}}``
is refused and graded wrong, which is a smaller harm than a stalled training step.
"""

from __future__ import annotations

import math
import re

__all__ = ["MAX_SYMBOLIC_CHARS", "symbolic_guard"]

MAX_SYMBOLIC_CHARS = 300
MAX_NESTING = 20
MAX_LITERAL_DIGITS = 100
# A numeric exponent whose value may exceed this is refused: comparing (x+1)^{1000} with
# its expansion already takes sympy seconds, and 2^{300} is a 91-digit number. Identical
# answers (2^{2023} vs 2^{2023}) never get here: they match as strings first.
MAX_NUMERIC_EXPONENT = 300
MAX_FACTORIAL_DIGITS = 3

# Never needed in a mathematical answer; their presence means code, not maths. The
# symbolic checker parses LaTeX only and never evaluates text, so this is belt and braces.
_FORBIDDEN = ("__", '"', "`", "import", "lambda", "eval", "exec")
_POWER_RE = re.compile(r"\^|\*\*")
_COMMAND_RE = re.compile(r"\\[A-Za-z]+")
_LITERAL_RE = re.compile(r"\d+")
_PAIRS = {"{": "}", "(": ")", "[": "]"}


def _group_end(text: str, start: int) -> int:
    """Index just past the bracket group opening at ``start`` (or len(text) if unclosed)."""
    opener, closer, depth = text[start], _PAIRS[text[start]], 0
    for i in range(start, len(text)):
        if text[i] == opener:
            depth += 1
        elif text[i] == closer:
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def _exponent_operand(text: str, start: int) -> tuple[str, bool]:
    """The operand of a power operator ending at ``start``, and whether another power follows.

    ``x^{a}`` gives "a"; ``x^(a)`` gives "a"; ``x^\\frac{1}{2}`` gives the command and its
    groups; ``x^123`` gives "123" (read as far as digits go, the worst case for size).
    """
    i = start
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text):
        return "", False
    if text[i] in "{(":
        end = _group_end(text, i)
        operand = text[i + 1 : end - 1]
    elif text[i] == "\\":
        command = _COMMAND_RE.match(text, i)
        end = command.end() if command else i + 1
        while end < len(text) and text[end] == "{":
            end = _group_end(text, end)
        operand = text[i:end]
    else:
        end = i + 1
        if text[i].isdigit() or text[i] == ".":
            while end < len(text) and (text[end].isdigit() or text[end] == "."):
                end += 1
        operand = text[i:end]
    chained = _POWER_RE.match(text[end:].lstrip()) is not None
    return operand, chained


def _numeric_bound(operand: str) -> float:
    """An upper bound on |value| of an expression made of numeric literals only.

    The product of max(2, literal) over the literals bounds any mix of +, -, *, / of
    those literals (each operation at most multiplies magnitudes).
    """
    log_bound = 0.0
    for literal in _LITERAL_RE.findall(operand):
        log_bound += math.log10(max(2, int(literal[: MAX_LITERAL_DIGITS + 1])))
    return math.inf if log_bound > 300 else 10**log_bound


def _group_before(text: str) -> str:
    """Content of the bracket group that ends ``text`` (which ends with ")" or "}")."""
    closer = text[-1]
    opener = "(" if closer == ")" else "{"
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        depth += 1 if text[i] == closer else -1 if text[i] == opener else 0
        if depth == 0:
            return text[i + 1 : -1]
    return text[:-1]


def _factorial_reason(before: str) -> str | None:
    """Why the factorial applied to the end of ``before`` is unsafe, or None."""
    if before.endswith("!"):
        return "a factorial of a factorial"
    if before.endswith((")", "}")):
        group = _group_before(before)
        if _has_letters(group):
            return None  # (n+1)! stays symbolic
        if "!" in group or _POWER_RE.search(group):
            return "a factorial of a power or factorial"
        if _numeric_bound(group) > 10**MAX_FACTORIAL_DIGITS:
            return f"a factorial of a number that may exceed {10**MAX_FACTORIAL_DIGITS}"
        return None
    digits = re.search(r"\d+$", before)
    if digits and len(digits.group()) > MAX_FACTORIAL_DIGITS:
        return f"a factorial of a number with more than {MAX_FACTORIAL_DIGITS} digits"
    return None


def _has_letters(operand: str) -> bool:
    return re.search(r"[A-Za-z]", _COMMAND_RE.sub("", operand)) is not None


def symbolic_guard(text: str) -> str | None:
    """Return why ``text`` must not reach the symbolic checker, or None if it may."""
    if len(text) > MAX_SYMBOLIC_CHARS:
        return f"answer longer than {MAX_SYMBOLIC_CHARS} characters"
    lowered = text.lower()
    for word in _FORBIDDEN:
        if word in lowered:
            return f"answer contains {word!r}"
    depth = 0
    for ch in text:
        depth += 1 if ch in "{([" else -1 if ch in "})]" else 0
        if depth > MAX_NESTING:
            return f"brackets nested deeper than {MAX_NESTING}"
    if any(len(lit) > MAX_LITERAL_DIGITS for lit in _LITERAL_RE.findall(text)):
        return f"a number with more than {MAX_LITERAL_DIGITS} digits"
    for bang in re.finditer(r"!", text):
        reason = _factorial_reason(text[: bang.start()].rstrip())
        if reason:
            return reason
    for power in _POWER_RE.finditer(text):
        operand, chained = _exponent_operand(text, power.end())
        if _has_letters(operand):
            continue  # a symbolic exponent stays symbolic in sympy; inner powers are checked too
        if chained or _POWER_RE.search(operand):
            return "a tower of numeric powers"
        if _numeric_bound(operand) > MAX_NUMERIC_EXPONENT:
            return f"a numeric exponent that may exceed {MAX_NUMERIC_EXPONENT}"
    return None
