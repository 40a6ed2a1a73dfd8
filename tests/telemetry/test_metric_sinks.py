"""MetricsLogger, read_metrics and truncate_metrics on real files."""

from __future__ import annotations

import importlib.machinery
import json
import math
import os
import sys
import types
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.telemetry import MetricsLogger, read_metrics, truncate_metrics
from rlvr.telemetry import sinks as sinks_module


def _strict_lines(path: Path) -> list[dict]:
    """Parse every line with a JSON parser that rejects NaN / Infinity tokens."""

    def reject(name: str) -> None:
        raise AssertionError(f"invalid JSON constant {name} in {path}")

    return [json.loads(line, parse_constant=reject) for line in path.read_text().splitlines()]


def test_nonfinite_values_are_strict_json_and_come_back_as_floats(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path) as logger:
        logger.log({"step": 0, "a": math.nan, "b": math.inf, "c": -math.inf, "d": 1.5, "s": "x"})
    (raw,) = _strict_lines(tmp_path / "metrics.jsonl")
    assert raw == {"step": 0, "a": "NaN", "b": "Infinity", "c": "-Infinity", "d": 1.5, "s": "x"}
    (back,) = read_metrics(tmp_path)
    assert math.isnan(back["a"]) and back["b"] == math.inf and back["c"] == -math.inf
    assert back["d"] == 1.5 and back["s"] == "x"


def test_each_line_is_flushed_and_fsynced_before_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    logger = MetricsLogger(tmp_path)
    logger.log({"step": 0, "reward_mean": 0.25})
    logger.log({"step": 1, "reward_mean": 0.5})
    # Another reader sees both lines while the logger is still open.
    assert [r["reward_mean"] for r in read_metrics(tmp_path)] == [0.25, 0.5]
    assert len(synced) == 2
    logger.close()
    with pytest.raises(RuntimeError, match="closed"):
        logger.log({"step": 2})


def test_tensor_values_become_plain_numbers(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path) as logger:
        logger.log(
            {"step": torch.tensor(3), "loss": torch.tensor(0.25), "v": torch.tensor([1.0, 2.0])}
        )
    (raw,) = _strict_lines(tmp_path / "metrics.jsonl")
    assert raw == {"step": 3, "loss": 0.25, "v": [1.0, 2.0]}


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        ({"reward_mean": 1.0}, "must contain 'step'"),
        ({"step": 1.5}, "whole number"),
        ({"step": True}, "whole number"),
        ({"step": -1}, ">= 0"),
    ],
)
def test_bad_step_is_rejected(tmp_path: Path, metrics: dict, message: str) -> None:
    with MetricsLogger(tmp_path) as logger, pytest.raises(ValueError, match=message):
        logger.log(metrics)
    assert read_metrics(tmp_path) == []


def test_truncate_on_resume_keeps_earlier_steps_only(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path) as logger:
        for step in range(10):
            logger.log({"step": step, "reward_mean": step / 10})
    # Resume from the checkpoint of step 4: steps 5..9 will be re-run.
    assert truncate_metrics(tmp_path, after_step=4) == 5
    with MetricsLogger(tmp_path) as logger:
        for step in range(5, 7):
            logger.log({"step": step, "reward_mean": -1.0})
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4, 5, 6]
    assert [r["reward_mean"] for r in records] == [0.0, 0.1, 0.2, 0.3, 0.4, -1.0, -1.0]
    # The atomic rewrite leaves no temporary file behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_truncate_without_a_file_is_a_no_op(tmp_path: Path) -> None:
    assert truncate_metrics(tmp_path, after_step=3) == 0
    assert not (tmp_path / "metrics.jsonl").exists()


def test_torn_last_line_is_skipped_and_cut_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with MetricsLogger(tmp_path) as logger:
        for step in range(3):
            logger.log({"step": step, "x": 1.0})
    with path.open("a") as handle:
        handle.write('{"step": 3, "rew')  # the process died mid-write
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]
    with MetricsLogger(tmp_path) as logger:
        logger.log({"step": 3, "x": 2.0})
    assert [r["step"] for r in _strict_lines(path)] == [0, 1, 2, 3]


def test_complete_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "x": 1}\n{"step": 1, "x": 2}')
    assert [r["x"] for r in read_metrics(tmp_path)] == [1, 2]
    with MetricsLogger(tmp_path) as logger:
        logger.log({"step": 2, "x": 3})
    assert [r["x"] for r in _strict_lines(path)] == [1, 2, 3]


def test_damaged_middle_line_is_an_error_naming_the_line(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1, oops\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2"):
        read_metrics(tmp_path)


@pytest.mark.parametrize(("flag", "extra"), [("tensorboard", "tensorboard"), ("wandb", "wandb")])
def test_optional_sink_asked_but_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: str, extra: str
) -> None:
    monkeypatch.setattr(sinks_module, "_module_available", lambda name: False)
    run_dir = tmp_path / "run"
    with pytest.raises(ImportError, match=rf"pip install rlvr\[{extra}\]"):
        MetricsLogger(run_dir, **{flag: True})
    assert not run_dir.exists()  # failed before touching the disk


def _fake_module(name: str, **attrs: object) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


def test_wandb_runs_offline_and_gets_finite_scalars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: dict[str, list] = {"init": [], "log": [], "finish": []}

    class FakeRun:
        def log(self, data: dict, step: int) -> None:
            calls["log"].append((data, step))

        def finish(self) -> None:
            calls["finish"].append(True)

    def init(**kwargs: object) -> FakeRun:
        calls["init"].append(kwargs)
        return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", _fake_module("wandb", init=init))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    with MetricsLogger(tmp_path / "run7", wandb=True, wandb_project="proj") as logger:
        logger.log({"step": 4, "reward_mean": 0.5, "kl": math.nan, "note": "text", "ok": True})
    (init_kwargs,) = calls["init"]
    assert init_kwargs["mode"] == "offline"
    assert init_kwargs["project"] == "proj" and init_kwargs["name"] == "run7"
    # NaN, strings and booleans are not sent; the step goes as the W&B step.
    assert calls["log"] == [({"reward_mean": 0.5}, 4)]
    assert calls["finish"] == [True]


def test_tensorboard_gets_one_scalar_per_finite_metric(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[tuple] = []

    class FakeWriter:
        def __init__(self, log_dir: str) -> None:
            written.append(("dir", log_dir))

        def add_scalar(self, key: str, value: float, global_step: int) -> None:
            written.append((key, value, global_step))

        def close(self) -> None:
            written.append(("closed",))

    monkeypatch.setitem(sys.modules, "tensorboard", _fake_module("tensorboard"))
    monkeypatch.setitem(
        sys.modules,
        "torch.utils.tensorboard",
        _fake_module("torch.utils.tensorboard", SummaryWriter=FakeWriter),
    )
    with MetricsLogger(tmp_path / "r", tensorboard=True) as logger:
        logger.log({"step": 2, "grad_norm": 3.0, "kl": math.inf})
    assert written == [
        ("dir", str(tmp_path / "r" / "tensorboard" / "r")),
        ("grad_norm", 3.0, 2),
        ("closed",),
    ]


_values = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10**9), 10**9)
_keys = st.text(min_size=1, max_size=8).filter(lambda k: k != "step")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.dictionaries(_keys, _values, max_size=5), min_size=1, max_size=5))
def test_round_trip_of_arbitrary_numeric_metrics(tmp_path_factory, rows: list[dict]) -> None:
    run_dir = tmp_path_factory.mktemp("rt")
    with MetricsLogger(run_dir) as logger:
        for step, row in enumerate(rows):
            logger.log({"step": step, **row})
    _strict_lines(run_dir / "metrics.jsonl")  # every line is strict JSON
    back = read_metrics(run_dir)
    assert len(back) == len(rows)
    for step, (row, got) in enumerate(zip(rows, back, strict=True)):
        assert got.pop("step") == step
        assert set(got) == set(row)
        for key, value in row.items():
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(got[key])
            else:
                assert got[key] == value
