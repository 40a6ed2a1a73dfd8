"""algo.objective=gspo (arXiv 2507.18071): its clip rule, its recipe, and two steps in the loop."""

from __future__ import annotations

import math
from pathlib import Path

from tests.training.test_train_e2e import REQUIRED, read_lines, tiny_config

from rlvr.config import load_config
from rlvr.training.preflight.checks import config_problems
from rlvr.training.trainer import Trainer

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "gspo.yaml"


def test_token_level_clip_is_refused_with_the_paper_values():
    cfg = load_config(None, ["algo.objective=gspo"])  # clip_low/high at their 0.2 defaults
    msgs = [p for p in config_problems(cfg) if "algo.objective=gspo" in p]
    assert len(msgs) == 1
    assert "algo.clip_low=0.2" in msgs[0] and "algo.clip_low=0.0003" in msgs[0]
    assert "algo.clip_high=0.0004" in msgs[0] and "recipes/gspo.yaml" in msgs[0]


def test_the_recipe_gives_the_paper_clip_and_validates():
    cfg = load_config(str(RECIPE), [])
    assert (cfg.algo.objective, cfg.algo.clip_low, cfg.algo.clip_high) == ("gspo", 3e-4, 4e-4)
    assert config_problems(cfg) == []


def test_gspo_trains_two_steps_with_finite_metrics(tiny_model_dir, tmp_path):
    # two minibatches: the second update sees sequence ratios != 1, so the clip can act
    cfg = tiny_config(
        tiny_model_dir,
        tmp_path,
        "algo.objective=gspo",
        "algo.clip_low=3e-4",
        "algo.clip_high=4e-4",
        "algo.minibatches=2",
        "train.lr=1e-2",
        "train.max_steps=2",
        "eval.before_after=false",
    )
    run_dir = Path(Trainer(cfg).fit()["run_dir"])
    lines = [m for m in read_lines(run_dir) if "reward_mean" in m]
    assert [m["step"] for m in lines] == [1, 2]
    keys = REQUIRED + ["seq_ratio_mean", "seq_ratio_min", "seq_ratio_max", "seq_clip_frac"]
    for m in lines:
        bad = {k: m.get(k) for k in keys if not math.isfinite(m.get(k, math.nan))}
        assert not bad, bad
        assert m["nonfinite_skipped"] == 0.0
        assert 0.0 <= m["seq_clip_frac"] <= 1.0
    # the second minibatch's sequence ratios moved off 1 after the first update at lr 1e-2
    assert any(m["seq_ratio_max"] > 1 + 1e-6 or m["seq_ratio_min"] < 1 - 1e-6 for m in lines)
