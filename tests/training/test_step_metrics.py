"""Folding micro-batch statistics into step metrics: named lists first, then by name suffix."""

from __future__ import annotations

from rlvr.training.step_metrics import summarize_update_stats


def test_statistics_fold_by_list_then_by_suffix():
    stats = [
        {"policy_loss": 0.5, "ratio_max": 1.1, "seq_clip_frac": 0.25, "w_max": 2.0, "w_min": 0.5},
        {"policy_loss": 0.25, "ratio_max": 1.3, "seq_clip_frac": 0.75, "w_max": 3.0, "w_min": 0.1},
        {"tokens": 7.0, "nonfinite_loss": 1.0},
    ]
    out = summarize_update_stats(stats, [], [1.0, 3.0])
    # policy_loss: micro-batch sum 0.75 over 2 optimizer steps; ratio_max listed as a max;
    # seq_clip_frac unknown -> mean 0.5; w_max -> 3.0, w_min -> 0.1 by suffix; counts dropped
    assert out["policy_loss"] == 0.375 and out["ratio_max"] == 1.3
    assert out["seq_clip_frac"] == 0.5 and out["w_max"] == 3.0 and out["w_min"] == 0.1
    assert "tokens" not in out and "nonfinite_loss" not in out
    assert out["grad_norm"] == 2.0 and out["optimizer_steps"] == 2.0
