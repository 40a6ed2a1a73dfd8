"""Every JSON file a run writes goes through the one atomic-write helper (a kill mid-write leaves
the old file or the new one, never a torn one). summary.json and early_stop.json used not to."""

from __future__ import annotations

import json

from test_train_e2e import tiny_config

import rlvr.jsonio as jsonio
from rlvr.training.trainer import Trainer


def test_status_summary_and_early_stop_are_written_atomically(
    tiny_model_dir, tmp_path, monkeypatch
):
    written: list[str] = []
    real = jsonio.atomic_write_text

    def recording(path, text):
        written.append(path.name)
        real(path, text)

    import rlvr.eval.in_training as in_training
    import rlvr.training.loop as run_loop
    import rlvr.training.trainer as trainer_module

    monkeypatch.setattr(run_loop, "atomic_write_text", recording)
    monkeypatch.setattr(trainer_module, "atomic_write_text", recording)
    monkeypatch.setattr(in_training, "atomic_write_text", recording)
    # a held-out score that falls at every eval: early stopping (patience 1) stops at step 1
    monkeypatch.setattr(
        in_training.InTrainingEvaluator,
        "_evaluate",
        lambda self, step: {"eval/heldout/greedy_pass@1": 1.0 - 0.1 * step},
    )
    cfg = tiny_config(
        tiny_model_dir,
        tmp_path,
        "train.max_steps=6",
        "eval.every=1",
        "eval.early_stop.enabled=true",
        "eval.early_stop.patience=1",
    )
    summary = Trainer(cfg).fit()
    run_dir = tmp_path / summary["run_dir"]
    stop = json.loads((run_dir / "early_stop.json").read_text())
    assert summary["steps"] == stop["step"] == 1
    for name in ("status.json", "summary.json", "early_stop.json", "best.json"):
        assert name in written, (name, written)
    leftovers = [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_atomic_writes_get_the_permissions_open_would_give(tmp_path):
    """A run's files are readable by the group and others under umask 022 (mkstemp's temporary
    file is owner-only, and the rename kept that: status.json was 0600), and stay owner-only
    under umask 077."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        jsonio.atomic_write_text(tmp_path / "a.json", "{}")
        os.umask(0o077)
        jsonio.atomic_write_text(tmp_path / "b.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "b.json").stat().st_mode) == 0o600
