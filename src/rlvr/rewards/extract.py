"""Find the final answer in a model response.

Order (first that yields a non-empty answer wins):

1. gpt-oss "Harmony" markup is reduced to the content of the last ``final`` channel
   message. A Harmony response with no final message has no answer: the model was cut
   off while still in its analysis channel, and grading its scratch work would reward
   unfinished reasoning.
2. the last complete, non-empty ``\\boxed{...}`` or ``\\fbox{...}`` (nested braces
   handled; an unclosed box, e.g. at a truncation point, is skipped);
3. the last ``<answer>...</answer>``;
4. the last GSM8K ``#### x`` line;
5. the last number-like token ``-?\\d[\\d,]*(?:\\.\\d+)?``.

Every step is linear in the length of the text (no backtracking regex, one pass for
brace matching), so a megabyte of output or ten thousand nested braces costs
milliseconds.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

__all__ = [
    "Extraction",
    "extract_answer",
    "extract_details",
    "gsm8k_answer",
    "harmony_final_text",
    "last_boxed",
    "last_match",
    "last_tag_content",
]

BOX_COMMANDS = ("\\boxed", "\\fbox")
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_GSM8K_RE = re.compile(r"####[ \t]*([^\n]*)")
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_HARMONY_MARKERS = ("<|channel|>", "<|message|>", "<|start|>")
# A final-channel header: "<|channel|>final" possibly followed by a constraint such as
# "<|constrain|>json" before "<|message|>".
_HARMONY_FINAL_RE = re.compile(
    r"<\|channel\|>\s*final\b[^<]*(?:<\|constrain\|>[^<]*)?<\|message\|>"
)
_HARMONY_END_RE = re.compile(r"<\|(?:end|return|call|start)\|>")

METHODS = ("boxed", "answer_tag", "gsm8k", "last_number", "none")


@dataclass(frozen=True)
class Extraction:
    """What ``extract_details`` found.

    ``answer`` is None when nothing was found. ``text`` is the text searched (after
    Harmony stripping); ``box_start`` is the index in ``text`` of the last
    ``\\boxed``/``\\fbox`` command (complete or not) or -1; ``unclosed_box`` is True when
    the last box command never closes (the response was cut inside it).
    """

    answer: str | None
    method: str
    text: str
    box_start: int
    unclosed_box: bool


def last_match(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    """The last non-overlapping match of ``pattern`` in ``text``, or None."""
    tail = deque(pattern.finditer(text), maxlen=1)
    return tail[0] if tail else None


def last_tag_content(
    text: str, open_tag: str = "<answer>", close_tag: str = "</answer>"
) -> str | None:
    """Content of the last complete ``open_tag ... close_tag`` pair, or None.

    Found with two ``rfind`` calls rather than a lazy regex, which would rescan to the
    end of the text for every unclosed opening tag (quadratic on hostile input).
    """
    close = text.rfind(close_tag)
    if close < 0:
        return None
    start = text.rfind(open_tag, 0, close)
    if start < 0:
        return None
    return text[start + len(open_tag) : close]


def harmony_final_text(text: str) -> str:
    """Return the content of the last Harmony ``final`` message, or ``text`` unchanged.

    Text without Harmony markers is returned as is. Text with markers but no final
    channel gives "" (see the module docstring).
    """
    if not any(marker in text for marker in _HARMONY_MARKERS):
        return text
    last = last_match(_HARMONY_FINAL_RE, text)
    if last is None:
        return ""
    body = text[last.end() :]
    end = _HARMONY_END_RE.search(body)
    return body[: end.start()] if end else body


def _matching_braces(text: str) -> dict[int, int]:
    """Map the index of each ``{`` that closes to the index of its ``}``; one pass."""
    stack: list[int] = []
    match: dict[int, int] = {}
    for i, ch in enumerate(text):
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            match[stack.pop()] = i
    return match


def _last_box(text: str) -> tuple[str | None, int, bool]:
    """(content of the last complete non-empty box, start of the last box command, unclosed)."""
    starts = [(m.start(), m.end() - 1) for m in _BOX_RE.finditer(text)]
    if not starts:
        return None, -1, False
    match = _matching_braces(text)
    last_start, last_open = starts[-1]
    unclosed = last_open not in match
    for _, open_idx in reversed(starts):
        close_idx = match.get(open_idx)
        if close_idx is None:
            continue
        content = text[open_idx + 1 : close_idx].strip()
        if content:
            return content, last_start, unclosed
    return None, last_start, unclosed


def last_boxed(text: str) -> str | None:
    """Content of the last complete, non-empty ``\\boxed{}``/``\\fbox{}`` of ``text``, or None."""
    return _last_box(text)[0]


def gsm8k_answer(text: str) -> str | None:
    """The text after the last GSM8K ``#### `` marker, stripped, or None when there is none."""
    found = last_match(_GSM8K_RE, text)
    return found.group(1).strip() or None if found is not None else None


def extract_details(text: str) -> Extraction:
    """Extract the final answer and where it came from (see the module docstring)."""
    if not isinstance(text, str):
        raise TypeError(f"response must be a str, got {type(text).__name__}")
    body = harmony_final_text(text)
    boxed, box_start, unclosed = _last_box(body)
    if boxed is not None:
        return Extraction(boxed, "boxed", body, box_start, unclosed)
    tagged = last_tag_content(body)
    if tagged is not None and tagged.strip():
        return Extraction(tagged.strip(), "answer_tag", body, box_start, unclosed)
    found = last_match(_GSM8K_RE, body)
    if found is not None and found.group(1).strip():
        return Extraction(found.group(1).strip(), "gsm8k", body, box_start, unclosed)
    found = last_match(_NUMBER_RE, body)
    if found is not None:
        return Extraction(found.group(0).rstrip(","), "last_number", body, box_start, unclosed)
    return Extraction(None, "none", body, box_start, unclosed)


def extract_answer(text: str) -> tuple[str | None, str]:
    """Return ``(answer, method)``; method is one of boxed, answer_tag, gsm8k, last_number, none."""
    found = extract_details(text)
    return found.answer, found.method
