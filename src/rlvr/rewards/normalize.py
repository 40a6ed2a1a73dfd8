"""Normalise an extracted answer so that equal answers become equal strings.

Three functions serve the three comparisons of the grader:

- ``clean_latex`` keeps the answer valid LaTeX (delimiters, ``\\text{}`` wrappers, unit
  words and spacing commands removed) for the symbolic checker;
- ``normalize_answer`` additionally drops all spaces, thousands separators and leading
  zeros, for plain string equality;
- ``parse_number`` reads the plain numeric forms (integers, decimals, ``a/b``,
  ``\\frac{a}{b}``) as exact fractions, for the 1e-6 numeric comparison.

Inputs are assumed short (the grader caps them); all loops are bounded by the length.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["clean_latex", "normalize_answer", "parse_number", "unwrap_commands"]

_WRAPPERS = ("text", "textbf", "textit", "textrm", "mathrm", "mathbf", "mbox", "operatorname")
_WRAPPER_RE = re.compile(r"\\(?:" + "|".join(_WRAPPERS) + r")\s*\{")
_DELIMS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_SPACING_RE = re.compile(r"\\[,;:! ]|\\q?quad\b")
_LEFT_RIGHT_RE = re.compile(r"\\(?:left|right)(?![A-Za-z])")
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°")
_PERCENT_RE = re.compile(r"\\?%")
# A leading "\$" or a lone "$" is a currency sign; "$5$ or $6$" keeps its math dollars.
_CURRENCY_RE = re.compile(r"^(?:\\\$|\$(?!.*\$))\s*")
_ASSIGN_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*\s*=\s*(?=\S)")
# Units stripped only after a number and only if at least two letters long, so that a
# single-letter variable ("5m", "3 x") is never mistaken for a unit.
_UNITS_TEXT = """
    mm cm km meter meters metre metres inch inches foot feet ft yard yards mile miles
    mg kg gram grams kilogram kilograms pound pounds lb lbs ounce ounces oz
    ml liter liters litre litres gallon gallons sec secs second seconds
    minute minutes min mins hour hours hr hrs day days week weeks month months
    year years dollar dollars cent cents euro euros degree degrees unit units
    square sq cubic mph kph
"""
_UNITS = _UNITS_TEXT.split()
_UNIT_WORD = r"(?:" + "|".join(sorted(_UNITS, key=len, reverse=True)) + r")"
_NUMBER = r"-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
_UNIT_SUFFIX_RE = re.compile(
    r"^(" + _NUMBER + r")\s*(?:" + _UNIT_WORD + r"\.?(?:\s*\^\s*\{?[23]\}?)?\s*)+$"
)
_THOUSANDS_RE = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_LEADING_ZEROS_RE = re.compile(r"^(-?)0+(?=\d)")
_COMMAND_SPACE_RE = re.compile(r"(\\[A-Za-z]+)\s+(?=[A-Za-z])")
_DECIMAL_RE = re.compile(r"^-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,3})?$")
_FRAC_RE = re.compile(r"^(-?)\\frac\{([^{}]+)\}\{([^{}]+)\}$")
_SLASH_RE = re.compile(r"^([^/]+)/([^/]+)$")
_MAX_NUMBER_CHARS = 64


def unwrap_commands(text: str) -> str:
    """Replace ``\\text{content}``-style wrappers by ``content``, braces matched, in one pass."""
    stack: list[int] = []
    closing: dict[int, int] = {}
    for i, ch in enumerate(text):
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            closing[stack.pop()] = i
    skip: set[int] = set()
    heads: dict[int, int] = {}
    for head in _WRAPPER_RE.finditer(text):
        close = closing.get(head.end() - 1)
        if close is not None:  # an unclosed wrapper is left as it is
            heads[head.start()] = head.end()
            skip.add(close)
    chars: list[str] = []
    i = 0
    while i < len(text):
        if i in heads:
            i = heads[i]
        else:
            if i not in skip:
                chars.append(text[i])
            i += 1
    return "".join(chars)


def _strip_delimiters(text: str) -> str:
    changed = True
    while changed:
        changed = False
        text = text.strip()
        for left, right in _DELIMS:
            inner = text[len(left) : len(text) - len(right)]
            if (
                len(text) >= len(left) + len(right)
                and text.startswith(left)
                and text.endswith(right)
                and left not in inner  # "$5$ or $6$" is two formulas, not one wrapped
            ):
                text = inner
                changed = True
                break
    return text


def clean_latex(answer: str) -> str:
    """Remove presentation-only parts of an answer but keep it valid LaTeX.

    Strips ``$..$``/``\\(..\\)``/``\\[..\\]``, ``\\text``-style wrappers, ``\\left``/``\\right``,
    spacing commands, degree signs, percent signs, a leading currency sign, a trailing
    period, a single-variable assignment prefix (``x = 5`` -> ``5``) and unit words
    after a number (``5 cm`` -> ``5``); turns ``\\dfrac``/``\\tfrac`` into ``\\frac``.
    """
    text = _strip_delimiters(answer)
    text = text.replace("{,}", ",").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = unwrap_commands(text)
    text = _LEFT_RIGHT_RE.sub("", text)
    text = _SPACING_RE.sub(" ", text)
    text = _DEGREE_RE.sub("", text)
    text = _PERCENT_RE.sub("", text)
    text = text.replace("~", " ").strip()
    text = _CURRENCY_RE.sub("", text)
    text = text.rstrip(".").strip()
    if text.count("=") == 1:
        text = _ASSIGN_RE.sub("", text)
    unit = _UNIT_SUFFIX_RE.match(text)
    if unit:
        text = unit.group(1)
    return _strip_delimiters(text)


def normalize_answer(answer: str) -> str:
    """``clean_latex`` plus: no spaces, no thousands separators, no leading zeros."""
    text = clean_latex(answer)
    text = _COMMAND_SPACE_RE.sub(r"\1 ", text)
    # Drop whitespace except the single space that keeps "\pi r" from becoming "\pir".
    text = re.sub(r"(?<![A-Za-z])\s+|\s+(?![A-Za-z])", "", text)
    if _THOUSANDS_RE.match(text):
        text = text.replace(",", "")
    return _LEADING_ZEROS_RE.sub(r"\1", text)


def _plain_decimal(text: str) -> Fraction | None:
    text = text.strip()
    if _THOUSANDS_RE.match(text):
        text = text.replace(",", "")
    if not _DECIMAL_RE.match(text):
        return None
    return Fraction(text)


def parse_number(text: str) -> Fraction | None:
    """Read a normalised answer as an exact number, or None if it is not a plain number.

    Accepts ``12``, ``-0.5``, ``.5``, ``1.5e3`` (exponent at most 3 digits, so "1e999999"
    cannot make a huge integer), ``3/4``, ``\\frac{3}{4}``, ``-\\frac{3}{4}``; a zero
    denominator gives None.
    """
    if len(text) > _MAX_NUMBER_CHARS:
        return None
    value = _plain_decimal(text)
    if value is not None:
        return value
    frac = _FRAC_RE.match(text)
    if frac:
        sign, num_text, den_text = frac.groups()
    else:
        slash = _SLASH_RE.match(text)
        if not slash:
            return None
        sign, (num_text, den_text) = "", slash.groups()
    num, den = _plain_decimal(num_text), _plain_decimal(den_text)
    if num is None or den is None or den == 0:
        return None
    return -num / den if sign else num / den
