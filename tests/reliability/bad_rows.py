"""Hypothesis strategies for JSONL dataset lines, good and malformed, with what the loader must say.

``lines()`` draws a file's worth of ``Line``s. A good line is a JSON object with a non-blank
string ``prompt`` and an ``answer`` that is a non-empty string or a finite number; a bad line is
one of the malformations the loader (``rlvr.data.loaders``) documents, tagged with the ``kind``
it must report and the ``field`` its message must name (None for a line that is not an object).
Blank lines are noise the loader skips without counting; they still advance the line number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hypothesis import strategies as st


@dataclass(frozen=True)
class Line:
    raw: bytes
    kind: str | None = None  # None: a good row (or a blank line when ``blank``)
    field: str | None = None
    prompt: str | None = None  # a good row's prompt, to check what was kept
    blank: bool = False


_TEXT = st.text(min_size=1, max_size=40).filter(lambda s: s.strip())
_BLANK_TEXT = st.text(alphabet=" \t\u00a0\u2003\r", max_size=5)
_EXTRA = st.dictionaries(
    st.sampled_from(["source", "id", "level", "numbers"]),
    st.one_of(st.integers(), _TEXT, st.lists(st.integers(), max_size=3)),
    max_size=2,
)
_GOOD_ANSWER = st.one_of(
    _TEXT,
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
)
_NOT_A_STRING = st.one_of(
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.just("k"), st.integers(), max_size=1),
)


def _dump(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


@st.composite
def good_line(draw) -> Line:
    row = draw(_EXTRA)
    row["prompt"] = draw(_TEXT)
    row["answer"] = draw(_GOOD_ANSWER)
    return Line(_dump(row), prompt=row["prompt"])


@st.composite
def bad_line(draw) -> Line:
    """One malformed line, its kind and the field named in the error."""
    good = {"prompt": draw(_TEXT), "answer": draw(_TEXT)}
    text = _dump(good)
    choice = draw(
        st.sampled_from(
            [
                "truncated_json",
                "garbage_json",
                "invalid_utf8",
                "not_an_object",
                "prompt_missing",
                "prompt_null",
                "prompt_wrong_type",
                "prompt_blank",
                "answer_missing",
                "answer_null",
                "answer_wrong_type",
                "answer_nonfinite",
                "answer_blank",
            ]
        )
    )
    if choice == "truncated_json":  # any proper prefix of an object leaves it unclosed
        chars = text.decode("utf-8")  # cut between characters: a torn character is bad UTF-8
        cut = draw(st.integers(min_value=1, max_value=len(chars) - 1))
        return Line(chars[:cut].encode("utf-8"), "invalid_json")
    if choice == "garbage_json":
        junk = draw(
            st.sampled_from(["{", "}{", "[1,", "prompt: x", "{'prompt': 'x'}", '{"a": 1,}', "NaN}"])
        )
        return Line(junk.encode(), "invalid_json")
    if choice == "invalid_utf8":
        at = draw(st.integers(min_value=0, max_value=len(text)))
        bad = draw(st.sampled_from([b"\xff", b"\xc3", b"\x80", b"\xed\xa0\x80", b"\xf8\x88\x80"]))
        return Line(text[:at] + bad + text[at:], "invalid_utf8")
    if choice == "not_an_object":
        value = draw(
            st.one_of(st.lists(st.integers(), max_size=3), st.integers(), _TEXT, st.none())
        )
        return Line(_dump(value), "not_an_object")
    field = choice.split("_")[0]
    row = dict(good)
    if choice.endswith("_missing"):
        del row[field]
        return Line(_dump(row), "missing_field", field)
    if choice.endswith("_null"):
        row[field] = None
        return Line(_dump(row), "missing_field", field)
    if choice.endswith("_blank"):
        row[field] = draw(_BLANK_TEXT)
        return Line(_dump(row), "empty_field", field)
    if choice == "answer_nonfinite":  # json.dumps writes the non-standard NaN / Infinity tokens
        row[field] = draw(st.sampled_from([float("nan"), float("inf"), float("-inf")]))
        return Line(json.dumps(row).encode(), "wrong_type", field)
    if field == "prompt":
        row[field] = draw(_NOT_A_STRING)
    else:  # a number is a fine answer, and so is a one-item list of one (OlympiadBench's
        # final_answer: ["$x$"] reads as its item); a bool, another list or a mapping is not
        several = st.lists(st.integers(), max_size=3).filter(lambda xs: len(xs) != 1)
        row[field] = draw(st.one_of(st.booleans(), several, st.just({"k": 1})))
    return Line(_dump(row), "wrong_type", field)


blank_line = _BLANK_TEXT.map(lambda s: Line(s.encode("utf-8"), blank=True))


def lines(min_bad: int = 0) -> st.SearchStrategy[list[Line]]:
    """A file's lines: good, bad and blank ones mixed, with at least ``min_bad`` bad ones."""
    return st.lists(st.one_of(good_line(), bad_line(), blank_line), min_size=1, max_size=25).filter(
        lambda ls: sum(line.kind is not None for line in ls) >= min_bad
    )


def file_bytes(file_lines: list[Line]) -> bytes:
    return b"".join(line.raw + b"\n" for line in file_lines)
