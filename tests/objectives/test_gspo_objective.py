"""algo.objective=gspo (arXiv 2507.18071): its clip rule, its recipe, and two steps in the loop."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tests.training.test_train_e2e import REQUIRED, read_lines, tiny_config

from rlvr.config import ConfigError, load_config
from rlvr.training.preflight.checks import check_config, config_problems
from rlvr.training.trainer import Trainer

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "gspo.yaml"


@pytest.mark.parametrize("objective", ["gspo", "gspo_token"])
def test_the_objective_brings_the_paper_clip_where_none_is_set(objective, tmp_path):
    """`rlvr train algo.objective=gspo` used to be refused (the generic clip 0.2 is a token
    range); the objective now brings the paper's 3e-4 / 4e-4 where the config sets no clip, from
    the command line or from a YAML file, and a clip the config sets itself is kept."""
    cfg = load_config(None, [f"algo.objective={objective}"])
    assert config_problems(cfg) == [] and cfg.algo.clip_low == 0.2  # checked on a copy
    check_config(cfg)
    assert (cfg.algo.clip_low, cfg.algo.clip_high) == (3e-4, 4e-4)
    path = tmp_path / "run.yaml"
    path.write_text(f"algo:\n  objective: {objective}\n  clip_high: 0.001\n")
    cfg = check_config(load_config(str(path), []))
    assert (cfg.algo.clip_low, cfg.algo.clip_high) == (3e-4, 1e-3)  # the file's own clip_high
    # another objective gets nothing
    cfg = check_config(load_config(None, ["algo.objective=grpo"]))
    assert (cfg.algo.clip_low, cfg.algo.clip_high) == (0.2, 0.2)


@pytest.mark.parametrize("objective", ["gspo", "gspo_token"])
def test_a_token_level_clip_set_explicitly_is_refused(objective):
    cfg = load_config(None, [f"algo.objective={objective}", "algo.clip_high=0.2"])
    msgs = [p for p in config_problems(cfg) if f"algo.objective={objective}" in p]
    assert len(msgs) == 1
    assert "algo.clip_low=0.0003 / algo.clip_high=0.2" in msgs[0]  # clip_low: the default
    assert "leave them unset" in msgs[0] and "recipes/gspo.yaml" in msgs[0]
    with pytest.raises(ConfigError, match="algo.clip_high=0.2"):
        check_config(cfg)
    # 0.01 is the edge: allowed
    assert (
        config_problems(load_config(None, [f"algo.objective={objective}", "algo.clip_low=0.01"]))
        == []
    )


def test_gspo_token_names_its_advantage_source():
    cfg = load_config(None, ["algo.objective=gspo_token", "algo.gspo_token.advantages=ppo"])
    assert config_problems(cfg) == [
        "algo.gspo_token.advantages='ppo' is unknown; known: grpo, drgrpo, rloo, psgrpo_steps, "
        "prm_dense"
    ]
    cfg = load_config(None, ["algo.objective=gspo_token", "algo.gspo_token.advantages=prm_dense"])
    assert config_problems(cfg) == [
        "algo.objective=prm_dense needs algo.psgrpo.prm (a PRM model folder or 'pkg.mod:fn')"
    ]


def test_gspo_token_with_group_advantages_is_gspo_in_the_loop(tiny_model_dir, tmp_path):
    """Two minibatches (the second sees ratios != 1 and a binding clip at lr 1e-2): with GRPO's
    sequence advantages on every token, one step of gspo_token leaves the same weights as gspo."""
    from tests.training.test_train_e2e import one_float32_step

    out = {}
    for objective in ("gspo", "gspo_token"):
        out[objective] = one_float32_step(
            tiny_model_dir,
            tmp_path / objective,
            f"algo.objective={objective}",
            "algo.minibatches=2",
        )
    (m0, w0, _), (m1, w1, _) = out["gspo"], out["gspo_token"]
    assert m0["seq_clip_frac"] > 0  # the premise: the clip acted
    assert m1["seq_clip_frac"] == m0["seq_clip_frac"]
    assert m1["policy_loss"] == pytest.approx(m0["policy_loss"], rel=1e-5, abs=1e-7)
    for k in w0:
        assert torch.allclose(w0[k], w1[k], atol=1e-6), k


def test_gspo_token_takes_prm_token_advantages(tiny_model_dir, tmp_path):
    cfg = tiny_config(
        tiny_model_dir,
        tmp_path,
        "algo.objective=gspo_token",
        "algo.gspo_token.advantages=prm_dense",
        "algo.psgrpo.prm=toy_rewards:toy_prm",
        "algo.psgrpo.step_pattern='[a-z]'",
        "algo.minibatches=2",
        "rollout.max_new_tokens=16",
        "train.max_steps=2",
        "eval.before_after=false",
    )
    run_dir = Path(Trainer(cfg).fit()["run_dir"])
    lines = [m for m in read_lines(run_dir) if "reward_mean" in m]
    assert len(lines) == 2
    for m in lines:
        assert m["step_count_mean"] > 0  # the PRM objective prepared the advantages
        assert all(math.isfinite(m[k]) for k in ("policy_loss", "grad_norm", "seq_ratio_mean"))
    assert any(m["adv_std"] > 0 for m in lines)


def test_the_recipe_gives_the_paper_clip_and_validates():
    cfg = load_config(str(RECIPE), [])
    assert (cfg.algo.objective, cfg.algo.clip_low, cfg.algo.clip_high) == ("gspo", 3e-4, 4e-4)
    assert config_problems(cfg) == []


def test_gspo_trains_two_steps_with_finite_metrics(tiny_model_dir, tmp_path):
    # two minibatches: the second update sees sequence ratios != 1, so the clip can act
    cfg = tiny_config(
        tiny_model_dir,
        tmp_path,
        "algo.objective=gspo",  # the paper's clip comes with it
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
