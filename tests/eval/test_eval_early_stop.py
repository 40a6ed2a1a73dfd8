"""rlvr.eval.early_stop on scripted metric sequences."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlvr.eval.early_stop import EarlyStopper


def run(stopper: EarlyStopper, values: list[float], first_step: int = 10) -> list[bool]:
    return [stopper.update(first_step * (i + 1), v) for i, v in enumerate(values)]


def test_two_consecutive_drops_stop_training() -> None:
    stopper = EarlyStopper("greedy_pass@1", patience=2)
    # step 10 0.30; 20 0.35 up; 30 0.33 drop (1); 40 0.36 up (reset 0);
    # 50 0.34 drop (1); 60 0.31 drop (2) -> stop at step 60
    decisions = run(stopper, [0.30, 0.35, 0.33, 0.36, 0.34, 0.31])
    assert decisions == [False, False, False, False, False, True]
    assert (stopper.best_step, stopper.best_value) == (40, 0.36)
    assert stopper.reason.startswith("stop: greedy_pass@1 got worse than the previous eval 2")
    assert "0.36 (step 40) -> 0.34 (step 50) -> 0.31 (step 60)" in stopper.reason
    assert "best greedy_pass@1 0.36 at step 40" in stopper.reason
    # once stopped it stays stopped, even if the metric recovers
    assert stopper.update(70, 0.9) is True


def test_flat_is_not_a_drop_and_below_best_is_not_enough() -> None:
    # the seed's rule compares with the previous eval, not with the best:
    # 0.5 -> 0.4 drop (1) -> 0.4 equal (reset) -> 0.4 -> 0.35 drop (1): no stop
    stopper = EarlyStopper("acc", patience=2)
    assert run(stopper, [0.5, 0.4, 0.4, 0.4, 0.35]) == [False] * 5
    assert stopper.drops == 1
    assert stopper.reason == "continue: 1 of 2 consecutive drops of acc; best acc 0.5 at step 10."


def test_min_delta_ignores_small_drops() -> None:
    stopper = EarlyStopper("acc", patience=2, min_delta=0.01)
    # 0.400 -> 0.395: worse by 0.005 <= 0.01, not a drop (0)
    # 0.395 -> 0.380: worse by 0.015 > 0.01, drop (1)
    # 0.380 -> 0.360: worse by 0.020, drop (2) -> stop
    assert run(stopper, [0.400, 0.395, 0.380, 0.360]) == [False, False, False, True]


def test_patience_one_and_min_mode() -> None:
    stopper = EarlyStopper("eval_loss", mode="min", patience=1)
    # a loss: 2.0 -> 1.5 better -> 1.2 better -> 1.3 worse (1) -> stop
    assert run(stopper, [2.0, 1.5, 1.2, 1.3]) == [False, False, False, True]
    assert (stopper.best_step, stopper.best_value) == (30, 1.2)


def test_ties_keep_the_earlier_best_step() -> None:
    stopper = EarlyStopper("acc")
    run(stopper, [0.5, 0.6, 0.6])
    assert stopper.best_step == 20


def test_state_dict_round_trip_through_json_matches_an_uninterrupted_run() -> None:
    values = [0.30, 0.35, 0.33, 0.36, 0.34, 0.31]
    whole = EarlyStopper("greedy_pass@1")
    expected = run(whole, values)

    first = EarlyStopper("greedy_pass@1")
    run(first, values[:5])  # interrupted after step 50, with one drop counted
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint would store it
    resumed = EarlyStopper("greedy_pass@1")
    resumed.load_state_dict(state)
    assert resumed.drops == 1 and resumed.best_step == 40
    assert resumed.update(60, values[5]) is expected[5] is True
    assert resumed.reason == whole.reason


def test_load_state_dict_refuses_another_metric() -> None:
    state = EarlyStopper("maj@8").state_dict()
    with pytest.raises(ValueError, match="tracks metric='maj@8' but this stopper has metric='g'"):
        EarlyStopper("g").load_state_dict(state)
    with pytest.raises(ValueError, match="early-stop state has no 'history'"):
        EarlyStopper("g").load_state_dict({"metric": "g", "mode": "max"})


def test_bad_arguments_and_values() -> None:
    with pytest.raises(ValueError, match="mode must be 'max' or 'min', got 'up'"):
        EarlyStopper("acc", mode="up")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="patience must be an integer >= 1, got 0"):
        EarlyStopper("acc", patience=0)
    with pytest.raises(ValueError, match="min_delta must be a finite number >= 0"):
        EarlyStopper("acc", min_delta=-0.1)
    stopper = EarlyStopper("acc")
    stopper.update(10, 0.5)
    with pytest.raises(ValueError, match="step 10 is not after the previous eval step 10"):
        stopper.update(10, 0.6)
    with pytest.raises(ValueError, match="acc at step 20 is nan"):
        stopper.update(20, float("nan"))


@given(st.lists(st.floats(0, 1), min_size=1, max_size=30), st.integers(1, 4))
def test_stop_means_patience_strict_drops_in_a_row(values: list[float], patience: int) -> None:
    stopper = EarlyStopper("acc", patience=patience)
    decisions = run(stopper, values)
    if True in decisions:
        at = decisions.index(True)
        window = values[at - patience : at + 1]
        assert at >= patience
        assert all(a > b for a, b in zip(window, window[1:], strict=False))
    else:
        assert stopper.reason.startswith("continue:")
    assert stopper.best_value == max(values)


@given(st.lists(st.floats(0, 1), min_size=1, max_size=30))
def test_a_never_falling_metric_never_stops(values: list[float]) -> None:
    stopper = EarlyStopper("acc", patience=1)
    assert not any(run(stopper, sorted(values)))
