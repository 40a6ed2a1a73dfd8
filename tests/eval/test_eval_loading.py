"""What `rlvr eval MODEL` points at, worked out from real folder layouts (no model is loaded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.eval.loading import adapter_base, resolve_source
from rlvr.model.loading import ModelLoadError


def make_run(root: Path, *, lora: bool = False) -> Path:
    """A run directory as training leaves it: config, metrics, final model, one checkpoint."""
    run = root / "runs" / "r1"
    model_file = "adapter_config.json" if lora else "config.json"
    for folder in (run / "final", run / "checkpoints" / "step_000010" / "model"):
        folder.mkdir(parents=True)
        (folder / model_file).write_text(json.dumps({"base_model_name_or_path": "/gone/base"}))
    (run / "config.yaml").write_text("train:\n  max_steps: 10\n")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    return run


def test_a_run_directory_means_its_final_model(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    source = resolve_source(str(run))
    assert (source.model, source.run_dir, source.is_adapter) == (str(run / "final"), run, False)


def test_folders_inside_a_run_find_the_run(tmp_path: Path) -> None:
    run = make_run(tmp_path, lora=True)
    final = resolve_source(str(run / "final"))
    assert (final.run_dir.resolve(), final.is_adapter) == (run.resolve(), True)
    checkpoint = resolve_source(str(run / "checkpoints" / "step_000010"))
    assert checkpoint.model == str(run / "checkpoints" / "step_000010" / "model")
    assert (checkpoint.run_dir.resolve(), checkpoint.is_adapter) == (run.resolve(), True)


def test_a_model_outside_any_run_has_no_run(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert resolve_source(str(model)).run_dir is None
    # --run names the config explicitly; it must be a run directory
    run = make_run(tmp_path)
    assert resolve_source(str(model), str(run)).run_dir == run
    with pytest.raises(ValueError, match="no config.yaml there"):
        resolve_source(str(model), str(tmp_path))


def test_a_hub_id_is_passed_through_and_an_empty_folder_is_an_error(tmp_path: Path) -> None:
    assert resolve_source("org/some-model").model == "org/some-model"
    with pytest.raises(ModelLoadError, match="is not a model folder"):
        resolve_source(str(tmp_path))


def test_adapter_base_order(tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    here = tmp_path / "base_here"
    here.mkdir()

    def recorded(base: str | None) -> None:
        (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base}))

    recorded(str(here))
    # 1. --base wins; 2. the recorded base when it exists on this machine
    assert adapter_base(adapter, explicit="x", config_base="y") == "x"
    assert adapter_base(adapter, explicit=None, config_base="y") == str(here)
    # 3. a recorded path missing here: the run config's model
    recorded(str(tmp_path / "gone"))
    assert adapter_base(adapter, explicit=None, config_base="y") == "y"
    # 4. no config: the recorded name as is (a hub id may be cached); 5. nothing: an error
    assert adapter_base(adapter, explicit=None, config_base=None) == str(tmp_path / "gone")
    recorded(None)
    with pytest.raises(ValueError, match="names no base model; pass --base"):
        adapter_base(adapter, explicit=None, config_base=None)
