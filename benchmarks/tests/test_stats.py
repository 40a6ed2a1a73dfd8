from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.harness.stats import (
    quartiles,
    rolling_mean,
    side_ratios,
    summarize_side,
    time_to_target,
    training_flops,
)


def test_quartiles_by_hand():
    # n=5: quartile positions 0.25*(n-1)=1, 2, 3 -> the 2nd, 3rd and 4th values
    assert quartiles([5, 1, 3, 2, 4]) == (2, 3, 4)
    # n=4: positions 0.75, 1.5, 2.25 -> 1+0.75*(2-1)=1.75, 2+0.5*(3-2)=2.5, 3+0.25*(4-3)=3.25
    assert quartiles([1, 2, 3, 4]) == pytest.approx((1.75, 2.5, 3.25))
    assert quartiles([7.0]) == (7.0, 7.0, 7.0)
    with pytest.raises(ValueError, match="empty"):
        quartiles([])


@given(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=2, max_size=40))
def test_quartiles_match_numpy_linear_percentiles(xs):
    q1, q2, q3 = quartiles(xs)
    assert min(xs) <= q1 <= q2 <= q3 <= max(xs)
    ref = np.percentile(xs, [25, 50, 75])  # numpy's default method is the same interpolation
    assert (q1, q2, q3) == pytest.approx(tuple(ref), abs=1e-6)


def test_rolling_mean_by_hand():
    # windows of 3 end at index 2 and 3: (1+0+1)/3 and (0+1+1)/3
    assert rolling_mean([1, 0, 1, 1], 3) == [None, None, pytest.approx(2 / 3), pytest.approx(2 / 3)]
    assert rolling_mean([4, 6], 1) == [4, 6]
    with pytest.raises(ValueError, match="window"):
        rolling_mean([1], 0)


def _recs(rewards, walls):
    return [{"reward_mean": r, "wall_s": w} for r, w in zip(rewards, walls, strict=True)]


def test_time_to_target_first_step_whose_window_reaches_it():
    # 3-step means: steps 1-3 (0.5+1+1)/3 = 0.833; steps 2-4 (1+1+0.75)/3 = 0.917 >= 0.9
    recs = _recs([0.5, 1.0, 1.0, 0.75, 1.0, 1.0], [10, 20, 30, 40, 50, 60])
    assert time_to_target(recs, 0.9, 3) == {"step": 4, "seconds": 100.0}  # 10+20+30+40
    # single steps at 1.0 are not enough without a full window at the target
    assert time_to_target(_recs([1.0, 1.0, 0.0], [1, 1, 1]), 0.9, 3) is None


def _step(wall, gen, upd, comp, prompt, reward, seqs=4):
    return {
        "wall_s": wall,
        "phases": {"generate": gen, "reward": 0.1, "logprob": 0.0, "update": upd, "sync": 0.0},
        "completion_tokens": comp,
        "prompt_tokens": prompt,
        "sequences": seqs,
        "reward_mean": reward,
    }


def test_training_flops_by_hand():
    # body 100, head 10, 3 prompt + 2 completion tokens: 6*(100*5 + 10*2) = 6*520 = 3120
    assert training_flops(100, 10, 3, 2) == 3120
    with pytest.raises(ValueError, match="prompt_tokens=-1"):
        training_flops(100, 10, -1, 2)


def test_summarize_side_by_hand():
    records = [
        _step(50.0, 40.0, 9.0, 999, 999, 0.0),  # warm-up, left out
        _step(10.0, 6.0, 3.0, 40, 20, 0.25),
        _step(12.0, 7.0, 4.0, 60, 20, 0.5),
        _step(20.0, 7.0, 3.0, 100, 20, 0.75),
    ]
    info = {"nonembed_params": 1000, "head_params": 100}
    s = summarize_side(records, 1, info, peak_flops=1e6)
    assert s["measured_steps"] == 3
    # walls 10, 12, 20: median 12, Q1 = 10+0.5*2 = 11, Q3 = 12+0.5*8 = 16
    assert s["step_time_median_s"] == 12.0
    assert s["step_time_iqr_s"] == pytest.approx(5.0)
    # 200 completion tokens over 20 s of generation, 10 s of update, 42 s in all
    assert s["gen_tokens_per_s"] == pytest.approx(10.0)
    assert s["trained_tokens_per_s"] == pytest.approx(20.0)
    assert s["e2e_tokens_per_s"] == pytest.approx(200 / 42)
    assert s["completion_len_mean"] == pytest.approx(200 / 12)  # 3 steps x 4 sequences
    # FLOPs: 6*(1000*(60 prompt + 200 completion) + 100*200) = 6*280000 = 1.68e6 over 10 s
    assert s["train_flops_per_s"] == pytest.approx(1.68e5)
    assert s["train_peak_fraction"] == pytest.approx(0.168)
    # other = wall - phases: 10-9.1, 12-11.1, 20-10.1 -> 0.9, 0.9, 9.9; median 0.9
    assert s["phase_median_s"]["other"] == pytest.approx(0.9)
    assert s["phase_median_s"]["generate"] == 7.0
    assert s["reward_mean"] == pytest.approx(0.5)


def test_summarize_side_needs_steps_after_warmup():
    with pytest.raises(ValueError, match="no steps left after 2 warm-up"):
        summarize_side(
            [_step(1, 1, 1, 1, 1, 0)] * 2, 2, {"nonembed_params": 1, "head_params": 1}, 1
        )


def test_side_ratios():
    r = side_ratios(
        {"step_time_median_s": 2.0, "peak_rss_mb": 300.0, "time_to_target_s": None},
        {"step_time_median_s": 4.0, "peak_rss_mb": 600.0, "time_to_target_s": 50.0},
    )
    assert r["step_time_median_s"] == 0.5
    assert r["peak_rss_mb"] == 0.5
    assert r["time_to_target_s"] is None  # one side never got there
