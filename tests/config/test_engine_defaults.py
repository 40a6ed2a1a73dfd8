"""What vLLM rollouts bring where the config sets none: the rollout correction chosen by
measurement (`VLLM_ROLLOUT_CORRECTION`, docs/performance.md), and only there."""

from __future__ import annotations

import pytest
import yaml

from rlvr.config import VLLM_ROLLOUT_CORRECTION, config_from_dict, load_config
from rlvr.training.preflight.checks import check_config, config_problems


def _checked(*overrides: str):
    return check_config(load_config(None, list(overrides)))


def test_vllm_rollouts_get_the_measured_correction():
    a = _checked("rollout.engine=vllm").algo
    rc = a.correction()
    assert rc is not None
    assert (rc.level, rc.action) == (
        VLLM_ROLLOUT_CORRECTION["level"],
        VLLM_ROLLOUT_CORRECTION["action"],
    )
    assert rc.cap == 2.0  # the section's own default


def test_server_mode_rollouts_are_vllm_whatever_the_trainers_venv_holds(monkeypatch):
    """The trainer of `rollout.mode=server` may run where vLLM is not installed (the worker runs
    from .venv-vllm): its rollouts are still vLLM's."""
    import rlvr.rollout.builder as builder

    monkeypatch.setattr(builder, "vllm_available", lambda: False)
    cfg = load_config(None, ["rollout.mode=server"])
    assert builder.engine_for(cfg) == "hf"  # the premise: auto alone would say hf
    rc = check_config(cfg).algo.correction()
    assert rc is not None and rc.level == VLLM_ROLLOUT_CORRECTION["level"]


def test_the_hf_engine_keeps_the_correction_off():
    assert _checked("rollout.engine=hf").algo.correction() is None


def test_what_the_user_set_is_kept():
    # an explicit off stays off under vLLM
    assert (
        _checked("rollout.engine=vllm", "algo.rollout_correction.level=off").algo.correction()
        is None
    )
    # tis_cap is a correction already: nothing added, and no "both set" refusal
    a = _checked("rollout.engine=vllm", "algo.tis_cap=3").algo
    assert a.rollout_correction.level == "off"
    assert (a.correction().level, a.correction().cap) == ("token", 3.0)
    # a cap or an action the user chose, without a level: the default level, their cap and action
    rc = _checked("rollout.engine=vllm", "algo.rollout_correction.cap=5").algo.correction()
    assert (rc.level, rc.cap) == (VLLM_ROLLOUT_CORRECTION["level"], 5.0)
    rc = _checked(
        "rollout.engine=vllm",
        "algo.rollout_correction.action=mask",
        "algo.rollout_correction.cap=4",
    ).algo.correction()
    assert (rc.level, rc.action, rc.bounds()) == (
        VLLM_ROLLOUT_CORRECTION["level"],
        "mask",
        (0.25, 4.0),
    )


@pytest.mark.parametrize("objective", ["gspo", "maxent_listwise"])
def test_objectives_without_a_per_token_term_get_none_and_are_not_refused(objective):
    overrides = ["rollout.engine=vllm", f"algo.objective={objective}"]
    if objective == "maxent_listwise":
        overrides.append("algo.group_size=4")
    cfg = load_config(None, overrides)
    assert not [p for p in config_problems(cfg) if "rollout_correction" in p]
    assert check_config(cfg).algo.correction() is None


def test_the_saved_config_reloads_to_the_same_correction(tmp_path):
    cfg = _checked("rollout.engine=vllm")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    again = check_config(config_from_dict(yaml.safe_load(path.read_text())))
    assert again.algo.rollout_correction == cfg.algo.rollout_correction
    # and applying twice changes nothing
    assert check_config(cfg).algo.rollout_correction == again.algo.rollout_correction


def test_a_dry_run_check_leaves_the_config_as_it_was():
    cfg = load_config(None, ["rollout.engine=vllm"])
    config_problems(cfg)  # checks a copy
    assert cfg.algo.rollout_correction.level == "off"
    assert "level" not in cfg.algo.rollout_correction.model_fields_set
