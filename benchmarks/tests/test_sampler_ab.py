"""The sampler A/B's statistics, worked by hand."""

from __future__ import annotations

import pytest

from benchmarks.studies.sampler_ab import permutation_p, steps_to_target, summarize


def test_permutation_p_counts_the_splits_at_least_as_far_apart():
    # pooled 1,2,3,4 split 2+2: six splits, means apart by 2 only for {1,2}|{3,4} and {3,4}|{1,2}
    assert permutation_p([1, 2], [3, 4]) == pytest.approx(2 / 6)
    # {1,3}|{2,4} is 1 apart: {1,2},{1,3},{2,4},{3,4} are at least that far (|{1,4}| gives 0)
    assert permutation_p([1, 3], [2, 4]) == pytest.approx(4 / 6)
    assert permutation_p([5, 5], [5, 5]) == 1.0


def _records(rewards):
    return [{"step": i + 1, "reward_mean": r, "reply_len": 10.0, "wall_s": 1.0}
            for i, r in enumerate(rewards)]  # fmt: skip


def test_steps_to_target_uses_the_trailing_mean_and_caps_misses():
    # trailing 3-step means: -, -, 0.6, 0.8, 0.9 -> step 5
    assert steps_to_target(_records([0.3, 0.6, 0.9, 0.9, 0.9]), 0.9, 3, cap=40) == 5
    assert steps_to_target(_records([0.3, 0.6, 0.9]), 0.9, 3, cap=40) == 41


def test_summarize_pairs_only_seeds_both_arms_ran():
    runs = {
        "loop": {"0": _records([1, 1, 1]), "1": _records([0, 1, 1, 1]), "2": _records([1, 1, 1])},
        "generate": {"0": _records([0, 0, 1, 1, 1]), "1": _records([1, 1, 1])},
    }
    s = summarize(runs, 0.9, 3, cap=40)
    assert s["seeds"] == [0, 1]
    assert s["steps"] == {"loop": [3, 4], "generate": [5, 3]}
    assert s["median"] == {"loop": 3.5, "generate": 4.0}
    assert s["p_value"] == pytest.approx(1.0)  # {3,4}|{5,3}: 0.5 apart; every split is >= 0.5
