"""Process reward models (PRMs) and the PS-GRPO reward built on them (URSA, arXiv 2501.04686).

A response is cut into steps (``Step 1: ...``, ``Step 2: ...``, ended by ``†Answer: ...``),
a PRM scores each step in [0, 1], and:

- ``math_prm_reward``: the minimum step score;
- ``psgrpo_reward``: 0 if the final answer is wrong; ``1 - gamma`` if it is right but the
  PRM scores fall sharply somewhere (a "drop moment": a relative drop between consecutive
  steps above ``rho``); 1 if right without one.

The PRM sees text only: image placeholders of a vision-language prompt (Qwen2-VL's
``<|vision_start|><|image_pad|>...<|vision_end|>`` spans, lone image/video pads, LLaVA's
``<image>``) are stripped from the prompt and the steps first (``score_steps``). Left in, they
become image tokens without pixels for the PRM's own tokenizer: a VLM scorer then refuses the
input (image features and image tokens do not match) and a text scorer conditions on noise.

The ``min_steps`` rule: a response with fewer than ``min_steps`` steps gets 0. It closes a
known hole: with one step there is no consecutive pair, the drop check
cannot fire, so a policy learns to answer in one step and its replies collapse in length.
``PSGRPOReward`` and ``MathPRMReward`` default to ``min_steps=2``; the bare
``psgrpo_reward``/``math_prm_reward`` functions default to 0 (the paper's formula).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rlvr.rewards.base import RewardResult
from rlvr.rewards.extract import extract_answer, last_match
from rlvr.rewards.math import DEFAULT_SYMBOLIC_TIMEOUT_S, answers_match, reference_answer

if TYPE_CHECKING:
    from rlvr.rewards.prm_hf import HFTokenClassificationPRM

__all__ = [
    "CallablePRM",
    "HFTokenClassificationPRM",
    "MathPRMReward",
    "PSGRPOReward",
    "ProcessRewardModel",
    "drop_moment",
    "final_answer",
    "math_prm_reward",
    "psgrpo_reward",
    "score_steps",
    "split_steps",
    "strip_image_placeholders",
]

DEFAULT_STEP_PATTERN = r"^Step \d+:"
DEFAULT_ANSWER_PATTERN = r"^†Answer:"
_DENOMINATOR_FLOOR = 1e-6
_VISION_SPAN = re.compile(r"<\|vision_start\|>.*?<\|vision_end\|>", re.DOTALL)
_PLACEHOLDER = re.compile(
    r"<\|(?:image_pad|video_pad|vision_pad|vision_start|vision_end)\|>|<image>"
)


def strip_image_placeholders(text: str) -> str:
    """``text`` without image placeholders (whole vision spans first, then lone markers)."""
    return _PLACEHOLDER.sub("", _VISION_SPAN.sub("", text))


def score_steps(prm: ProcessRewardModel, prompt: str, steps: list[str]) -> list[float]:
    """``prm``'s finite score of each step, image placeholders stripped from prompt and steps
    (the one way rlvr calls a PRM)."""
    if not steps:
        return []
    clean = [strip_image_placeholders(s) for s in steps]
    scores = _check_scores(prm.score_steps(strip_image_placeholders(prompt), clean))
    if len(scores) != len(steps):
        raise ValueError(f"PRM returned {len(scores)} scores for {len(steps)} steps")
    return scores


def __getattr__(name: str) -> Any:
    # The Hugging Face PRM pulls in torch; load it only when asked for.
    if name == "HFTokenClassificationPRM":
        from rlvr.rewards.prm_hf import HFTokenClassificationPRM

        return HFTokenClassificationPRM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def split_steps(
    response: str,
    step_pattern: str = DEFAULT_STEP_PATTERN,
    answer_pattern: str = DEFAULT_ANSWER_PATTERN,
) -> list[str]:
    """Cut ``response`` into its steps.

    A step starts where ``step_pattern`` matches (at a line start; patterns are compiled
    with MULTILINE) and runs to the next step, the first ``answer_pattern`` match, or the
    end. Text before the first step and from the answer line on belongs to no step. Each
    step keeps its marker (``"Step 1: ..."``) and is stripped. No marker gives ``[]``.
    """
    step_re = re.compile(step_pattern, re.MULTILINE)
    answer = re.compile(answer_pattern, re.MULTILINE).search(response)
    body = response[: answer.start()] if answer else response
    starts = [m.start() for m in step_re.finditer(body)]
    ends = [*starts[1:], len(body)]
    return [body[s:e].strip() for s, e in zip(starts, ends, strict=False)]


def final_answer(response: str, answer_pattern: str = DEFAULT_ANSWER_PATTERN) -> str | None:
    """The text after the last ``answer_pattern`` match up to the end of its line, if any."""
    last = last_match(re.compile(answer_pattern, re.MULTILINE), response)
    if last is None:
        return None
    text = response[last.end() :].split("\n", 1)[0].strip()
    return text or None


def _check_scores(step_scores: Sequence[float]) -> list[float]:
    scores = [float(s) for s in step_scores]
    bad = [s for s in scores if not math.isfinite(s)]
    if bad:
        raise ValueError(f"step_scores must be finite, got {bad[0]}")
    return scores


def drop_moment(step_scores: Sequence[float], rho: float) -> tuple[float, bool]:
    """Largest relative drop between consecutive step scores, and whether it exceeds ``rho``.

    ``drop_j = max(0, (s_j - s_{j+1}) / max(s_j, 1e-6))`` for j = 1..n-1 (the floor keeps a
    zero score from dividing by zero). Fewer than two steps: ``(0.0, False)``.
    """
    if rho < 0:
        raise ValueError(f"rho must be >= 0, got {rho}")
    scores = _check_scores(step_scores)
    drops = [
        max(0.0, (prev - nxt) / max(prev, _DENOMINATOR_FLOOR))
        for prev, nxt in zip(scores, scores[1:], strict=False)
    ]
    worst = max(drops, default=0.0)
    return worst, worst > rho


def psgrpo_reward(
    correct: bool,
    step_scores: Sequence[float],
    rho: float = 0.3,
    gamma: float = 0.5,
    *,
    min_steps: int = 0,
) -> float:
    """PS-GRPO reward: 0 if wrong or fewer than ``min_steps`` steps; 1 - gamma with a drop
    moment; 1 otherwise."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if not correct or len(step_scores) < min_steps:
        return 0.0
    _, has_drop = drop_moment(step_scores, rho)
    return 1.0 - gamma if has_drop else 1.0


def math_prm_reward(step_scores: Sequence[float], *, min_steps: int = 0) -> float:
    """Minimum step score; 0.0 with no steps or fewer than ``min_steps``."""
    scores = _check_scores(step_scores)
    if not scores or len(scores) < min_steps:
        return 0.0
    return min(scores)


@runtime_checkable
class ProcessRewardModel(Protocol):
    """Scores each step of a response: one float in [0, 1] per step."""

    def score_steps(self, prompt: str, steps: list[str]) -> list[float]: ...


class CallablePRM:
    """A PRM from a plain function ``fn(prompt, steps) -> list[float]`` (checked per call)."""

    def __init__(self, fn: Callable[[str, list[str]], Sequence[float]]) -> None:
        if not callable(fn):
            raise TypeError(f"CallablePRM needs a callable, got {type(fn).__name__}")
        self.fn = fn

    def score_steps(self, prompt: str, steps: list[str]) -> list[float]:
        scores = _check_scores(self.fn(prompt, steps))
        if len(scores) != len(steps):
            raise ValueError(f"PRM returned {len(scores)} scores for {len(steps)} steps")
        return scores


class _StepRewardBase:
    """Shared parts of the PRM-based rewards: split, grade, score."""

    def __init__(
        self,
        prm: ProcessRewardModel,
        *,
        min_steps: int = 2,
        step_pattern: str = DEFAULT_STEP_PATTERN,
        answer_pattern: str = DEFAULT_ANSWER_PATTERN,
        timeout_s: float = DEFAULT_SYMBOLIC_TIMEOUT_S,
    ) -> None:
        if not isinstance(prm, ProcessRewardModel):
            raise TypeError(f"prm must have score_steps(prompt, steps), got {type(prm).__name__}")
        if min_steps < 0:
            raise ValueError(f"min_steps must be >= 0, got {min_steps}")
        self.prm = prm
        self.min_steps = min_steps
        self.step_pattern = step_pattern
        self.answer_pattern = answer_pattern
        self.timeout_s = timeout_s
        re.compile(step_pattern)  # fail now on a bad pattern, not mid-training
        re.compile(answer_pattern)

    def _assess(self, prompt: str, response: str, reference: str) -> tuple[bool, list[float]]:
        """(answer correct, step scores). The answer is the ``answer_pattern`` line if
        present, else whatever ``extract_answer`` finds."""
        answer = final_answer(response, self.answer_pattern)
        if answer is None:
            answer, _ = extract_answer(response)
        ref = reference_answer(reference)
        correct = False
        if answer is not None and ref:
            correct, _ = answers_match(answer, ref, timeout_s=self.timeout_s)
        steps = split_steps(response, self.step_pattern, self.answer_pattern)
        return correct, score_steps(self.prm, prompt, steps)


class PSGRPOReward(_StepRewardBase):
    """``psgrpo_reward`` of (graded answer, PRM step scores) as a RewardResult.

    info: correct, step_count, has_drop_moment, max_relative_drop, min_step_score.
    """

    def __init__(
        self, prm: ProcessRewardModel, *, rho: float = 0.3, gamma: float = 0.5, **kwargs: Any
    ) -> None:
        super().__init__(prm, **kwargs)
        if rho < 0:
            raise ValueError(f"rho must be >= 0, got {rho}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        self.rho = rho
        self.gamma = gamma

    def __call__(self, prompt: str, response: str, reference: str, **row: Any) -> RewardResult:
        correct, scores = self._assess(prompt, response, reference)
        worst, has_drop = drop_moment(scores, self.rho)
        score = psgrpo_reward(correct, scores, self.rho, self.gamma, min_steps=self.min_steps)
        info = {
            "correct": float(correct),
            "step_count": float(len(scores)),
            "has_drop_moment": float(has_drop),
            "max_relative_drop": worst,
            "min_step_score": min(scores, default=0.0),
        }
        return RewardResult(score, info)


class MathPRMReward(_StepRewardBase):
    """``math_prm_reward`` (minimum step score) as a RewardResult; correctness is only logged.

    info: correct, step_count, min_step_score.
    """

    def __call__(self, prompt: str, response: str, reference: str, **row: Any) -> RewardResult:
        correct, scores = self._assess(prompt, response, reference)
        score = math_prm_reward(scores, min_steps=self.min_steps)
        info = {
            "correct": float(correct),
            "step_count": float(len(scores)),
            "min_step_score": min(scores, default=0.0),
        }
        return RewardResult(score, info)
