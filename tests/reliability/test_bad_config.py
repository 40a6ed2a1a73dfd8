"""Malformed config values: every one is refused by ``check_config(load_config(...))`` with a
ConfigError naming the knob, from an override or a YAML file, and ``rlvr train`` exits with code 2
and that message (no traceback) before it loads a model."""

from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reliability.bad_configs import (
    BAD_VALUES,
    NONFINITE_FLOAT_KNOBS,
    NUMERIC_KNOBS,
    WRONG_TYPES,
    nested,
    override,
)
from reliability.figures import add
from rlvr.cli.main import main as cli_main
from rlvr.config import Config, ConfigError, known_keys, load_config
from rlvr.training.preflight.checks import check_config

# train.adam_betas has its own test below (torch checks it, but only after the model loads).
RULE_KNOBS = sorted(k for k in BAD_VALUES if k != "train.adam_betas")
KNOWN_KEYS = known_keys(Config)


@st.composite
def knob_and_bad_value(draw, knobs: list[str]) -> tuple[str, object]:
    knob = draw(st.sampled_from(knobs))
    return knob, draw(BAD_VALUES[knob])


def rejected(overrides: list[str] | None = None, path: Path | None = None) -> str:
    """The ConfigError message for this config; fails the test if the config is accepted."""
    with pytest.raises(ConfigError) as caught:
        check_config(load_config(path, overrides))
    return str(caught.value)


@settings(max_examples=200, deadline=None)
@given(knob_and_bad_value(RULE_KNOBS))
def test_a_value_breaking_its_rule_is_refused_naming_the_knob(pair) -> None:
    knob, value = pair
    message = rejected([override(knob, value)])
    assert knob in message, message
    add("bad_config", values_tried=1, refused_naming_knob=1)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(NUMERIC_KNOBS), WRONG_TYPES)
def test_a_value_of_the_wrong_type_is_refused_naming_the_knob(knob, value) -> None:
    message = rejected([override(knob, value)])
    assert knob in message, message
    add("bad_config", values_tried=1, refused_naming_knob=1)


@settings(max_examples=60, deadline=None)
@given(knob_and_bad_value(RULE_KNOBS))
def test_the_same_values_in_a_yaml_file_are_refused_naming_the_knob(pair) -> None:
    knob, value = pair
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "run.yaml"
        path.write_text(yaml.safe_dump(nested(knob, value)))
        message = rejected(path=path)
    assert knob in message, message
    add("bad_config", values_tried=1, refused_naming_knob=1)


def _typo(key: str, position: int, char: str) -> str:
    """``key`` with ``char`` inserted into its last part at ``position`` (mod its length)."""
    head, _, last = key.rpartition(".")
    at = position % (len(last) + 1)
    new_last = last[:at] + char + last[at:]
    return f"{head}.{new_last}" if head else new_last


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from([k for k in KNOWN_KEYS if "." in k]),
    st.integers(min_value=0, max_value=40),
    st.sampled_from("abcdefghijklmnopqrstuvwxyz_"),
)
def test_an_unknown_key_is_refused_naming_it(key, position, char) -> None:
    typo = _typo(key, position, char)
    if typo in KNOWN_KEYS:  # inserting a letter happened to spell another knob
        return
    message = rejected([f"{typo}=1"])
    assert f"unknown config key {typo!r}" in message, message
    # the suggestion (or each of the few a shared leaf gets), when there is one, is a real knob
    if "did you mean" in message:
        suggested = re.findall(r"'([^']+)'", message.split("did you mean ")[1])
        assert suggested and all(k in KNOWN_KEYS for k in suggested), message
    add("bad_config", values_tried=1, refused_naming_knob=1)


@pytest.mark.parametrize(
    "text, words",
    [
        ("train: {lr: [", "not valid YAML"),
        ("- 1\n- 2\n", "must hold a mapping"),
        ("just a sentence", "must hold a mapping"),
        ("train:\n  lr: 1\n lr: 2\n", "not valid YAML"),
        ("train: 5\n", "train"),
        ("\tmodel: x\n", "not valid YAML"),
    ],
)
def test_a_broken_yaml_file_is_refused_naming_the_file(tmp_path, text, words) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    message = rejected(path=path)
    assert words in message
    if words != "train":
        assert str(path) in message


def accepted(pairs: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """The (knob, value) pairs that ``check_config(load_config(...))`` lets through, or whose
    ConfigError does not name the knob."""
    out = []
    for knob, value in pairs:
        try:
            check_config(load_config(None, [override(knob, value)]))
        except ConfigError as exc:
            if knob not in str(exc):
                out.append((knob, value))
        else:
            out.append((knob, value))
    return out


def test_nan_and_infinity_are_refused_where_they_cannot_mean_anything() -> None:
    """NaN or an infinity in these knobs would reach the first update or the reward pool (an
    infinite reward.timeout_s raises OverflowError inside the step's select())."""
    pairs = [(k, v) for k in NONFINITE_FLOAT_KNOBS for v in (math.nan, math.inf, -math.inf)]
    assert accepted(pairs) == []
    add("bad_config", values_tried=len(pairs))


def test_adam_betas_outside_zero_one_are_refused_before_the_model_loads() -> None:
    """torch.optim.AdamW refuses these too, but only after the model is loaded and with a
    message that names no config knob ("Invalid beta parameter at index 0: 1.0")."""
    pairs = [("train.adam_betas", b) for b in ([1.0, 0.999], [0.9, 1.5], [-0.1, 0.9])]
    assert accepted(pairs) == []
    add("bad_config", values_tried=len(pairs))


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(pair=knob_and_bad_value(RULE_KNOBS))
def test_rlvr_train_exits_2_with_the_knob_named_and_no_traceback(
    pair, tiny_model_dir, capsys, restore_threads
) -> None:
    knob, value = pair
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "runs"
        argv = [
            "train",
            f"model.name_or_path={tiny_model_dir}",
            f"train.output_dir={out}",
            "train.max_steps=1",
            "rollout.max_new_tokens=4",
            "logging.progress=false",
            override(knob, value),  # last, so it wins over the settings above
        ]
        capsys.readouterr()
        code = cli_main(argv)
        err = capsys.readouterr().err
        assert code == 2, err
        assert knob in err and "Traceback" not in err
        assert not out.exists() or not any(out.rglob("metrics.jsonl"))
    add("bad_config", train_runs_refused=1)
