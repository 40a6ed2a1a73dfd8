"""The settings a resume may not change (checkpoint.resume_plan.check_resume_config), against a
checkpoint's own config.yaml on disk."""

from __future__ import annotations

import pytest
import yaml

from rlvr.checkpoint.resume_plan import check_resume_config
from rlvr.config import ConfigError, load_config


def _checkpoint(tmp_path, *overrides: str):
    ckpt = tmp_path / "checkpoints" / "step_3"
    ckpt.mkdir(parents=True)
    cfg = load_config(None, list(overrides))
    (ckpt / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    return ckpt


@pytest.mark.parametrize(
    "key, saved, now",
    [
        # the sampler's position counts prompts and samples: a resume with another group size
        # or prompts per step would not continue the same data order
        ("algo.group_size", 8, 4),
        ("algo.prompts_per_step", 4, 8),
        ("algo.objective", "drgrpo", "grpo"),
    ],
)
def test_a_resume_that_changes_a_fixed_key_is_refused_naming_it(tmp_path, key, saved, now):
    ckpt = _checkpoint(tmp_path, f"{key}={saved}")
    with pytest.raises(ConfigError) as err:
        check_resume_config(load_config(None, [f"{key}={now}"]), ckpt)
    assert f"{key}: checkpoint {saved!r}, now {now!r}" in str(err.value)


def test_a_resume_may_change_the_learning_rate(tmp_path):
    ckpt = _checkpoint(tmp_path, "train.lr=2e-5")
    check_resume_config(load_config(None, ["train.lr=1e-5"]), ckpt)
