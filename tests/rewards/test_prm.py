"""Step splitting, drop moments and the PS-GRPO reward, worked by hand."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rlvr.rewards.prm import (
    CallablePRM,
    MathPRMReward,
    PSGRPOReward,
    drop_moment,
    final_answer,
    math_prm_reward,
    psgrpo_reward,
    split_steps,
    strip_image_placeholders,
)

RESPONSE = (
    "Let me think.\n"
    "Step 1: The triangle has angles 50 and 60.\n"
    "Step 2: The third angle is 180 - 110.\n"
    "So it is 70. Step 3: is not a marker here.\n"
    "Step 3: Hence x = 70.\n"
    "†Answer: 70\n"
    "Step 4: after the answer, ignored"
)


def test_split_steps() -> None:
    assert split_steps(RESPONSE) == [
        "Step 1: The triangle has angles 50 and 60.",
        "Step 2: The third angle is 180 - 110.\nSo it is 70. Step 3: is not a marker here.",
        "Step 3: Hence x = 70.",
    ]
    assert split_steps("no markers at all") == []
    assert split_steps("## 1\nfoo\n## 2\nbar", step_pattern=r"^## \d+") == [
        "## 1\nfoo",
        "## 2\nbar",
    ]


def test_final_answer() -> None:
    assert final_answer(RESPONSE) == "70"
    assert final_answer("Step 1: x\n†Answer:   \n") is None
    assert final_answer("no answer line") is None


@pytest.mark.parametrize(
    ("scores", "rho", "max_drop", "has_drop"),
    [
        # (0.9-0.6)/0.9 = 0.3333, (0.6-0.55)/0.6 = 0.0833 -> max 0.3333 > 0.3
        ([0.9, 0.6, 0.55], 0.3, 1 / 3, True),
        # 0.2/0.8 = 0.25 <= 0.3
        ([0.8, 0.6], 0.3, 0.25, False),
        # a rise clamps to 0; (0.9-0.2)/0.9 = 0.7778
        ([0.5, 0.9, 0.2], 0.3, 7 / 9, True),
        # rising from 0: (0-0.5)/max(0, 1e-6) is negative, clamped to 0
        ([0.0, 0.5], 0.3, 0.0, False),
        # falling to 0: 0.2/0.2 = 1
        ([0.2, 0.0], 0.3, 1.0, True),
        # exactly rho is not a drop moment: 0.25/1.0 = 0.25, and 0.25 > 0.25 is false
        ([1.0, 0.75], 0.25, 0.25, False),
        # one step or none: nothing to compare
        ([0.7], 0.3, 0.0, False),
        ([], 0.3, 0.0, False),
    ],
)
def test_drop_moment(scores, rho, max_drop, has_drop) -> None:
    got_drop, got_has = drop_moment(scores, rho)
    assert got_drop == pytest.approx(max_drop, abs=1e-12)
    assert got_has is has_drop


def test_drop_moment_floor_for_zero_score() -> None:
    # (1e-7 - 0) / max(1e-7, 1e-6) = 0.1: the 1e-6 floor, not 1e-7, is the denominator
    assert drop_moment([1e-7, 0.0], 0.3)[0] == pytest.approx(0.1)


def test_psgrpo_reward() -> None:
    drop = [0.9, 0.6, 0.55]  # has a drop moment (see above)
    steady = [0.8, 0.75, 0.7]  # drops 0.0625 and 0.0667
    assert psgrpo_reward(False, steady) == 0.0
    assert psgrpo_reward(True, drop) == 0.5  # 1 - gamma, gamma = 0.5
    assert psgrpo_reward(True, steady) == 1.0
    assert psgrpo_reward(True, drop, gamma=0.2) == pytest.approx(0.8)
    assert psgrpo_reward(True, drop, rho=0.5) == 1.0  # 0.3333 <= 0.5
    assert psgrpo_reward(True, [0.9], min_steps=2) == 0.0
    assert psgrpo_reward(True, [0.9]) == 1.0  # the paper's formula lets one step through
    with pytest.raises(ValueError, match="gamma"):
        psgrpo_reward(True, steady, gamma=1.5)


def test_math_prm_reward() -> None:
    assert math_prm_reward([0.9, 0.4, 0.7]) == 0.4
    assert math_prm_reward([]) == 0.0
    assert math_prm_reward([0.9], min_steps=2) == 0.0
    with pytest.raises(ValueError, match="finite"):
        math_prm_reward([0.5, float("nan")])


unit = st.floats(0.0, 1.0, allow_nan=False)


@settings(max_examples=100, deadline=None)
@given(scores=st.lists(unit, max_size=8), rho=st.floats(0.0, 1.0))
def test_drop_moment_properties(scores: list[float], rho: float) -> None:
    worst, has = drop_moment(scores, rho)
    assert 0.0 <= worst <= 1.0  # scores in [0, 1]: a drop is at most the whole score
    assert has == (worst > rho)
    # appending a step can only add a consecutive pair, never lower the maximum
    assert drop_moment([*scores, 0.5], rho)[0] >= worst


@settings(max_examples=100, deadline=None)
@given(scores=st.lists(st.floats(0.01, 1.0), min_size=2, max_size=8), scale=st.floats(0.1, 10.0))
def test_relative_drop_is_scale_free(scores: list[float], scale: float) -> None:
    assume(all(s * scale >= 1e-6 for s in scores))
    assert drop_moment([s * scale for s in scores], 0.3)[0] == pytest.approx(
        drop_moment(scores, 0.3)[0], rel=1e-9, abs=1e-12
    )


@settings(max_examples=100, deadline=None)
@given(correct=st.booleans(), scores=st.lists(unit, max_size=6), gamma=st.floats(0.0, 1.0))
def test_psgrpo_reward_takes_three_values(correct: bool, scores: list[float], gamma: float) -> None:
    reward = psgrpo_reward(correct, scores, 0.3, gamma)
    assert reward in (0.0, 1.0 - gamma, 1.0)
    assert (reward == 0.0) or correct


def _fixed_prm(scores: list[float]):
    """A PRM that gives the k-th step scores[k] and records what it was asked."""
    calls: list[tuple[str, list[str]]] = []

    def fn(prompt: str, steps: list[str]) -> list[float]:
        calls.append((prompt, steps))
        return scores[: len(steps)]

    return CallablePRM(fn), calls


def test_psgrpo_reward_object() -> None:
    prm, calls = _fixed_prm([0.9, 0.6, 0.55])
    reward = PSGRPOReward(prm)
    result = reward("What is x?", RESPONSE, "70")
    assert result.score == 0.5  # right, with a drop moment (0.3333 > 0.3)
    assert result.info == {
        "correct": 1.0,
        "step_count": 3.0,
        "has_drop_moment": 1.0,
        "max_relative_drop": pytest.approx(1 / 3),
        "min_step_score": 0.55,
    }
    assert calls[0][0] == "What is x?" and len(calls[0][1]) == 3
    assert reward("What is x?", RESPONSE, "71").score == 0.0


def test_one_step_answers_get_nothing_by_default() -> None:
    """Seed 001's hack: one step skips the drop check. min_steps=2 closes it."""
    prm, _ = _fixed_prm([0.9])
    one_step = "Step 1: x is 70.\n†Answer: 70"
    assert PSGRPOReward(prm)("q", one_step, "70").score == 0.0
    assert PSGRPOReward(prm, min_steps=1)("q", one_step, "70").score == 1.0


def test_answer_without_answer_line_uses_the_usual_extraction() -> None:
    prm, _ = _fixed_prm([0.8, 0.8])
    response = "Step 1: 3 + 4.\nStep 2: so \\boxed{7}"
    assert PSGRPOReward(prm)("q", response, "7").score == 1.0


def test_math_prm_reward_object() -> None:
    prm, _ = _fixed_prm([0.9, 0.6, 0.55])
    result = MathPRMReward(prm)("q", RESPONSE, "70")
    assert result.score == 0.55
    assert result.info == {"correct": 1.0, "step_count": 3.0, "min_step_score": 0.55}


def test_callable_prm_checks_its_output() -> None:
    with pytest.raises(ValueError, match="2 scores for 3 steps"):
        CallablePRM(lambda p, s: [0.5, 0.5]).score_steps("q", ["a", "b", "c"])
    with pytest.raises(ValueError, match="finite"):
        CallablePRM(lambda p, s: [float("inf")]).score_steps("q", ["a"])
    with pytest.raises(TypeError, match="callable"):
        CallablePRM(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="score_steps"):
        PSGRPOReward(object())  # type: ignore[arg-type]


VLM_PROMPT = (
    "<|im_start|>user\n<|vision_start|>"
    + "<|image_pad|>" * 4
    + "<|vision_end|>How many red squares?<|im_end|>\n<|im_start|>assistant\n"
)
VLM_RESPONSE = (
    "Step 1: The figure <|image_pad|>shows 3 squares.\nStep 2: Two are red <image>.\n†Answer: 2"
)


def test_image_placeholders_never_reach_the_prm() -> None:
    """A VLM prompt's vision span and placeholders a reply happens to contain are stripped from
    what the PRM scores; the answer is still graded on the reply."""
    prm, calls = _fixed_prm([0.9, 0.8])
    result = PSGRPOReward(prm)(VLM_PROMPT, VLM_RESPONSE, "2")
    assert result.score == 1.0 and result.info["step_count"] == 2.0
    assert calls == [
        (
            "<|im_start|>user\nHow many red squares?<|im_end|>\n<|im_start|>assistant\n",
            ["Step 1: The figure shows 3 squares.", "Step 2: Two are red ."],
        )
    ]
    assert strip_image_placeholders("a<|vision_start|>x\ny<|vision_end|>b<|video_pad|>") == "ab"
