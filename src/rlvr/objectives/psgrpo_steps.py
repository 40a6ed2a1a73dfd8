"""PS-GRPO "variant 2" in the loop: PRM step scores and each completion token's step index.

The advantage maths is `rlvr.algorithms.psgrpo_step_advantages`; this file only finds which
tokens belong to which step (through the tokenizer's character offsets) and asks the PRM.
"""

from __future__ import annotations

import re

import torch

from rlvr.rewards.prm import score_steps, split_steps


def step_spans(text: str, step_pattern: str, answer_pattern: str) -> list[tuple[int, int, str]]:
    """(start, end, step text) of each step in ``text``, in order, as character offsets."""
    spans, cursor = [], 0
    for step in split_steps(text, step_pattern, answer_pattern):
        start = text.find(step, cursor)
        if start < 0:  # split_steps strips; find() on the stripped text always succeeds
            raise ValueError(f"step {step[:40]!r} not found in the response")
        spans.append((start, start + len(step), step))
        cursor = start + len(step)
    return spans


def token_step_ids(tokenizer, token_ids: list[int], spans: list[tuple[int, int, str]]) -> list[int]:
    """Step index of each token: -1 before the first step, after the last one, and on special tokens.

    Step j owns the characters from its start up to the next step's start (the last step up to
    its end); a token belongs to the step owning its first character, whose position is the
    length of the decoded prefix before it.
    """
    bounds = [
        (s, spans[j + 1][0] if j + 1 < len(spans) else e) for j, (s, e, _) in enumerate(spans)
    ]
    out, prev_len = [], 0
    for k in range(len(token_ids)):
        start = prev_len
        prev_len = len(tokenizer.decode(token_ids[: k + 1], skip_special_tokens=True))
        idx = -1
        if prev_len > start:  # a special token adds no text and belongs to no step
            idx = next((j for j, (s, e) in enumerate(bounds) if s <= start < e), -1)
        out.append(idx)
    return out


class StepScorer:
    """Scores each response's steps with a PRM and lays them out over its tokens."""

    def __init__(self, prm, step_pattern: str, answer_pattern: str):
        self.prm = prm
        self.step_pattern = step_pattern
        self.answer_pattern = answer_pattern
        re.compile(step_pattern)
        re.compile(answer_pattern)

    def __call__(
        self, tokenizer, prompts: list[str], texts: list[str], comp_ids: list[list[int]]
    ) -> tuple[list[list[float]], torch.Tensor]:
        """Step scores per response and the ``[N, T]`` step index of every token (-1 outside steps)."""
        width = max(1, max(len(c) for c in comp_ids))
        ids = torch.full((len(texts), width), -1, dtype=torch.long)
        scores: list[list[float]] = []
        for i, (prompt, text, toks) in enumerate(zip(prompts, texts, comp_ids, strict=True)):
            spans = step_spans(text, self.step_pattern, self.answer_pattern)
            scores.append(score_steps(self.prm, prompt, [s[2] for s in spans]))
            if spans:
                ids[i, : len(toks)] = torch.tensor(token_step_ids(tokenizer, toks, spans))
        return scores, ids
