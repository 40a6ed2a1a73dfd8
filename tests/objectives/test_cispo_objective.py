"""algo.objective=cispo (arXiv 2506.13585): its config rules and two steps in the loop."""

from __future__ import annotations

import math
from pathlib import Path

from tests.training.test_train_e2e import REQUIRED, read_lines, tiny_config

from rlvr.config import load_config
from rlvr.training.preflight.checks import config_problems
from rlvr.training.trainer import Trainer


def test_config_rules_name_the_knob():
    ok = load_config(None, ["algo.objective=cispo", "algo.clip_low=1.0", "algo.clip_high=0.28"])
    assert config_problems(ok) == []
    bad = load_config(
        None, ["algo.objective=cispo", "algo.loss_agg=seq_mean_token_mean", "algo.clip_low=1.5"]
    )
    msgs = config_problems(bad)
    assert any("algo.loss_agg must be auto or token_mean" in m for m in msgs)
    assert any(m.startswith("algo.clip_low=1.5: must be <= 1 with cispo") for m in msgs)


def test_cispo_trains_two_steps_with_finite_metrics(tiny_model_dir, tmp_path):
    # two minibatches at lr 1e-2: the second update's ratios leave [0.8, 1.2] on some tokens
    cfg = tiny_config(
        tiny_model_dir,
        tmp_path,
        "algo.objective=cispo",
        "algo.minibatches=2",
        "train.lr=1e-2",
        "train.max_steps=2",
        "eval.before_after=false",
    )
    run_dir = Path(Trainer(cfg).fit()["run_dir"])
    lines = [m for m in read_lines(run_dir) if "reward_mean" in m]
    assert [m["step"] for m in lines] == [1, 2]
    keys = REQUIRED + ["cispo_weight_mean", "cispo_weight_min", "cispo_weight_max"]
    keys += ["cispo_clip_frac"]
    for m in lines:
        bad = {k: m.get(k) for k in keys if not math.isfinite(m.get(k, math.nan))}
        assert not bad, bad
        assert m["nonfinite_skipped"] == 0.0
        # the weights are the ratios clipped to [0.8, 1.2]
        assert 0.8 - 1e-6 <= m["cispo_weight_min"] <= m["cispo_weight_max"] <= 1.2 + 1e-6
    assert any(m["ratio_max"] > 1 + 1e-6 or m["ratio_min"] < 1 - 1e-6 for m in lines)
