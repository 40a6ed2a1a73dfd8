"""LR schedules against hand-computed values, the scheduler the trainer uses, and the pre-flight."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.training.schedule import (
    build_scheduler,
    format_preflight,
    lr_factor,
    preflight_check,
    schedule_table,
    steps_per_run,
    warmup_steps_from_ratio,
)

torch.set_num_threads(1)

COSINE = {"kind": "cosine", "warmup_steps": 10, "total_steps": 100, "min_lr_ratio": 0.1}


@pytest.mark.parametrize(
    ("step", "expected_lr"),
    [
        (0, 1e-6),  # warm-up: (0 + 1) / 10 = 0.1 of the peak 1e-5
        (4, 5e-6),  # (4 + 1) / 10 = 0.5
        (9, 1e-5),  # (9 + 1) / 10 = 1.0: last warm-up step is at the peak
        (10, 1e-5),  # progress (10 - 10) / 90 = 0 -> 0.1 + 0.9 * (1 + cos 0) / 2 = 1.0
        # progress (25 - 10) / 90 = 1/6, cos(pi/6) = 0.8660254
        # -> 0.1 + 0.9 * (1 + 0.8660254) / 2 = 0.1 + 0.8397114 = 0.9397114
        (25, 9.397114e-6),
        (55, 5.5e-6),  # progress (55 - 10) / 90 = 0.5, cos(pi/2) = 0 -> 0.1 + 0.45 = 0.55
        (100, 1e-6),  # progress 1, cos(pi) = -1 -> 0.1 (the floor)
        (150, 1e-6),  # past the end it stays at the floor
    ],
)
def test_cosine_values(step: int, expected_lr: float) -> None:
    lr = 1e-5 * lr_factor(step, **COSINE)
    assert lr == pytest.approx(expected_lr, rel=1e-6)


@pytest.mark.parametrize(
    ("kind", "step", "expected"),
    [
        ("linear", 40, 0.7),  # progress 30/90 = 1/3 -> 1 - 0.9 / 3 = 0.7
        ("linear", 55, 0.55),  # progress 1/2 -> 1 - 0.45
        ("linear", 100, 0.1),
        ("constant", 3, 0.4),  # still warming up: (3 + 1) / 10
        ("constant", 99, 1.0),
    ],
)
def test_linear_and_constant_values(kind: str, step: int, expected: float) -> None:
    factor = lr_factor(step, kind=kind, warmup_steps=10, total_steps=100, min_lr_ratio=0.1)
    assert factor == pytest.approx(expected, rel=1e-12)


def test_no_warmup_starts_at_peak() -> None:
    assert lr_factor(0, kind="cosine", warmup_steps=0, total_steps=10) == 1.0
    # progress 5/10 -> 0.1 + 0.9 * 0.5 = 0.55 (min_lr_ratio defaults to 0.1)
    assert lr_factor(5, kind="cosine", warmup_steps=0, total_steps=10) == pytest.approx(0.55)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "step"}, "unknown schedule kind 'step'; known: constant, cosine, linear"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"total_steps": 0}, "total_steps"),
        ({"min_lr_ratio": 1.5}, "min_lr_ratio"),
    ],
)
def test_bad_schedule_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        lr_factor(0, **{**COSINE, **kwargs})


def test_negative_step_is_an_error() -> None:
    with pytest.raises(ValueError, match="step"):
        lr_factor(-1, **COSINE)


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["constant", "cosine", "linear"]),
    warmup=st.integers(0, 30),
    total=st.integers(1, 200),
    min_ratio=st.floats(0.0, 1.0),
)
def test_schedule_shape(kind: str, warmup: int, total: int, min_ratio: float) -> None:
    factors = [
        lr_factor(s, kind=kind, warmup_steps=warmup, total_steps=total, min_lr_ratio=min_ratio)
        for s in range(warmup + total + 5)  # also covers a warm-up longer than the run
    ]
    ramp, rest = factors[:warmup], factors[warmup:]
    # warm-up rises strictly and never reaches beyond the peak
    assert all(a < b for a, b in zip(ramp, ramp[1:], strict=False))
    assert all(0.0 < f <= 1.0 for f in ramp)
    # after warm-up: starts at the peak, never increases, never below the floor
    assert rest[0] == pytest.approx(1.0)
    assert all(b <= a + 1e-12 for a, b in zip(rest, rest[1:], strict=False))
    assert all(min_ratio - 1e-12 <= f <= 1.0 + 1e-12 for f in rest)


def test_build_scheduler_follows_lr_factor_and_resumes() -> None:
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([param], lr=1e-5)
    scheduler = build_scheduler(optimizer, **COSINE)
    seen = []
    for _ in range(60):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # Step s ran at peak * lr_factor(s): 1e-6 at step 0, 5.5e-6 at step 55 (see above).
    assert seen[0] == pytest.approx(1e-6) and seen[55] == pytest.approx(5.5e-6)
    assert seen == pytest.approx([1e-5 * lr_factor(s, **COSINE) for s in range(60)])

    # A fresh optimizer + scheduler loaded from the state dict continues at step 60.
    state = scheduler.state_dict()
    optimizer2 = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=1e-5)
    scheduler2 = build_scheduler(optimizer2, **COSINE)
    scheduler2.load_state_dict(state)
    optimizer2.param_groups[0]["lr"] = scheduler2.get_last_lr()[0]
    assert optimizer2.param_groups[0]["lr"] == pytest.approx(1e-5 * lr_factor(60, **COSINE))


def test_schedule_table_default_and_chosen_steps() -> None:
    table = schedule_table(1e-5, **COSINE)
    # start, last warm-up step, first decay step, quarters and the last step
    assert [s for s, _ in table] == [0, 9, 10, 25, 50, 75, 99]
    assert dict(table)[25] == pytest.approx(9.397114e-6)
    assert schedule_table(2e-5, **COSINE, steps=[55]) == [(55, pytest.approx(1.1e-5))]


def test_preflight_fails_for_warmup_longer_than_the_run() -> None:
    result = preflight_check(
        1e-5, check_step=20, kind="cosine", warmup_steps=100, total_steps=50, min_lr_ratio=0.1
    )
    # step 20 is still warming up: (20 + 1) / 100 = 0.21 of the peak < 0.3
    assert not result.ok
    assert result.lr_at_check == pytest.approx(2.1e-6)
    assert result.max_lr_by_check == pytest.approx(2.1e-6)
    # the longest warm-up that passes: (20 + 1) / W >= 0.3 -> W <= 70
    assert "warmup_steps <= 70" in result.message and result.message.startswith("FAIL")


def test_preflight_passes_for_short_warmup() -> None:
    result = preflight_check(
        1e-5, check_step=20, kind="cosine", warmup_steps=5, total_steps=50, min_lr_ratio=0.1
    )
    # progress (20 - 5) / 45 = 1/3, cos(pi/3) = 0.5 -> 0.1 + 0.9 * 1.5 / 2 = 0.775
    assert result.ok
    assert result.lr_at_check == pytest.approx(7.75e-6)
    assert result.max_lr_by_check == pytest.approx(1e-5)


def test_preflight_does_not_fail_a_short_run_that_already_decayed() -> None:
    result = preflight_check(
        1e-5, check_step=20, kind="cosine", warmup_steps=2, total_steps=25, min_lr_ratio=0.1
    )
    # progress (20 - 2) / 23 = 0.7826, cos(0.7826 pi) = -0.7757 -> 0.1 + 0.45 * 0.2243 = 0.2009:
    # below 0.3 at step 20, but the peak was reached at step 1, so the warm-up is fine.
    expected = 0.1 + 0.9 * (1 + math.cos(math.pi * 18 / 23)) / 2
    assert expected == pytest.approx(0.2009, abs=1e-4)
    assert result.lr_at_check == pytest.approx(1e-5 * expected)
    assert result.ok


def test_preflight_on_a_run_shorter_than_the_check_step() -> None:
    result = preflight_check(1e-5, kind="constant", warmup_steps=100, total_steps=10)
    # checks the last step, 9: (9 + 1) / 100 = 0.1 of the peak
    assert not result.ok and result.check_step == 9
    assert result.lr_at_check == pytest.approx(1e-6)
    assert "only 10 steps" in result.message


def test_format_preflight_is_a_table_with_the_verdict() -> None:
    result = preflight_check(1e-5, kind="cosine", warmup_steps=100, total_steps=50)
    lines = format_preflight(result).splitlines()
    assert lines[0].split() == ["step", "lr", "of", "peak"]
    check_rows = [line for line in lines if line.endswith("<- check")]
    assert len(check_rows) == 1
    assert check_rows[0].split()[:3] == ["20", "2.100e-06", "21.0%"]
    assert lines[-1] == result.message


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        ((400, 16, 1), {}, 25),  # 400 // 16 = 25 steps per epoch
        ((100, 8, 3), {}, 36),  # 100 // 8 = 12 full steps, x 3 epochs
        ((100, 8, 3), {"drop_last": False}, 39),  # ceil(100 / 8) = 13, x 3
        ((100, 8, 3), {"max_steps": 20}, 20),
        ((100, 8, 3), {"max_steps": 500}, 36),
    ],
)
def test_steps_per_run(args: tuple, kwargs: dict, expected: int) -> None:
    assert steps_per_run(*args, **kwargs) == expected


def test_steps_per_run_bad_input() -> None:
    with pytest.raises(ValueError, match="fewer than prompts_per_step"):
        steps_per_run(5, 8, 1)
    with pytest.raises(ValueError, match="epochs"):
        steps_per_run(100, 8, 0)


def test_warmup_from_ratio() -> None:
    assert warmup_steps_from_ratio(0.05, 50) == 3  # ceil(2.5)
    assert warmup_steps_from_ratio(0.0, 50) == 0
    with pytest.raises(ValueError, match="ratio"):
        warmup_steps_from_ratio(1.5, 50)
