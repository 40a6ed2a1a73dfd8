"""rollout.max_staleness=k > 0 trains batches sampled by weights up to k versions old: without a
behaviour correction the update takes them with ratio exactly 1 (no old-log-prob pass), a
gradient biased by how far the sampler was behind. A config that leaves the correction unset
gets one (token truncation, cap 2), announced on the run's first lines; one that turns it off,
or an objective that cannot take one, is refused naming both knobs."""

from __future__ import annotations

import pytest
from test_staleness import COMMON
from test_train_e2e import read_lines, tiny_config

from rlvr.config import VLLM_ROLLOUT_CORRECTION, ConfigError, load_config
from rlvr.training.preflight.checks import check_config, config_problems
from rlvr.training.trainer import Trainer


def test_stale_hf_batches_get_the_correction_and_train_with_its_weights(
    tiny_model_dir, tmp_path, capsys
):
    """k=1 with the hf engine (no correction of its own): step 2 trains the batch version 0
    sampled with version 1's weights. Its tokens must be weighted by pi_1 / pi_0 (tis_* metrics,
    some weight != 1), not trained with ratio 1 as if on-policy."""
    cfg = tiny_config(
        tiny_model_dir,
        tmp_path,
        *COMMON,
        "rollout.engine=hf",
        "rollout.max_staleness=1",
        "train.lr=3e-3",
        "train.max_steps=2",
    )
    trainer = Trainer(cfg)
    rc = trainer.cfg.algo.correction()
    assert rc is not None
    assert (rc.level, rc.action, rc.cap) == (
        VLLM_ROLLOUT_CORRECTION["level"],
        VLLM_ROLLOUT_CORRECTION["action"],
        2.0,
    )
    trainer.fit()
    first_lines = capsys.readouterr().out
    assert "rollout correction: token truncate" in first_lines
    assert "rollout.max_staleness=1" in first_lines  # why it is on, and what it takes to drop it
    lines = [m for m in read_lines(trainer.run.run_dir) if m["step"] > 0]
    assert [m["staleness_max"] for m in lines] == [0.0, 1.0]
    stale = lines[1]
    assert stale["logprob_diff_max"] > 1e-3  # the old-log-prob pass ran and saw the lag
    assert stale["tis_weight_min"] < 1.0 or stale["tis_weight_max"] > 1.0


def test_on_policy_hf_runs_keep_the_correction_off():
    cfg = check_config(load_config(None, ["rollout.engine=hf"]))
    assert cfg.algo.correction() is None


@pytest.mark.parametrize("extra", [["algo.rollout_correction.level=off"], []])
def test_a_stale_run_with_the_correction_turned_off_is_refused(extra):
    """level=off said outright; and with an objective default that cannot apply: both knobs
    named."""
    cfg = load_config(None, ["rollout.engine=hf", "rollout.max_staleness=2", *extra])
    problems = config_problems(cfg)
    if not extra:
        assert not [p for p in problems if "max_staleness" in p]
        return
    [p] = [p for p in problems if "rollout.max_staleness=2" in p]
    assert "algo.rollout_correction.level" in p and "algo.tis_cap" in p
    with pytest.raises(ConfigError, match=r"rollout\.max_staleness=2"):
        check_config(cfg)


@pytest.mark.parametrize("objective", ["gspo", "maxent_listwise"])
def test_objectives_that_take_no_correction_refuse_stale_batches(objective):
    cfg = load_config(
        None,
        [
            "rollout.engine=hf",
            "rollout.max_staleness=1",
            f"algo.objective={objective}",
            "algo.group_size=4",
        ],
    )
    [p] = [p for p in config_problems(cfg) if "rollout.max_staleness" in p]
    assert f"algo.objective={objective}" in p
    assert "algo.rollout_correction.level" in p and "algo.tis_cap" in p
    # on-policy, the same objective is fine
    cfg.rollout.max_staleness = 0
    assert not [p for p in config_problems(cfg) if "max_staleness" in p]
