"""Numerical faults: a non-finite loss or gradient injected at a chosen step skips that update
(weights bit for bit unchanged, the optimizer not stepped), is logged as ``nonfinite_skipped``,
and the run goes on; faults on consecutive steps trip the health gate's ``nonfinite`` rule
(HealthStop in process, exit code 3 from ``rlvr train``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from reliability.figures import add
from reliability.runs import (
    read_status,
    same_weights,
    snapshot,
    step_metrics,
    tiny_config,
    tiny_overrides,
)
from rlvr.cli.main import main as cli_main
from rlvr.objectives import Objective
from rlvr.telemetry.health import HealthStop, read_health
from rlvr.training.trainer import Trainer

# A skipped first update leaves the scheduler stepping before the optimizer ever has; torch warns
# about that order, which is intended here (the schedule counts training steps, skipped or not).
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`")


class StepRecorder:
    """Wraps ``trainer.train_step`` to keep the weights before and after every step."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.before: dict[int, dict] = {}
        self.after: dict[int, dict] = {}
        self._real = trainer.train_step
        trainer.train_step = self  # run_training calls trainer.train_step()

    def __call__(self) -> dict:
        step = self.trainer.step + 1  # the step being taken (the counter moves after it)
        self.before[step] = snapshot(self.trainer.model)
        metrics = self._real()
        self.after[step] = snapshot(self.trainer.model)
        return metrics

    def unchanged(self, step: int) -> bool:
        return same_weights(self.before[step], self.after[step])


def nan_loss_at(trainer: Trainer, bad_steps: set[int], monkeypatch) -> None:
    """Make every micro-batch loss of the given steps NaN (its statistics stay as computed)."""
    real = trainer.run.objective.loss

    def loss(mb, counts):
        value, stats = real(mb, counts)
        if trainer.step + 1 in bad_steps:
            value = value * float("nan")
        return value, stats

    monkeypatch.setattr(trainer.run.objective, "loss", loss)


def adam_steps(trainer: Trainer) -> int:
    """How many times the optimizer has stepped (AdamW keeps a per-parameter count)."""
    first = next(p for p in trainer.model.parameters() if p.requires_grad)
    state = trainer.state.optimizer.state.get(first, {})
    return int(state["step"]) if "step" in state else 0


def test_a_nan_loss_skips_that_update_and_the_run_goes_on(
    tiny_model_dir, tmp_path, monkeypatch, restore_threads
) -> None:
    trainer = Trainer(tiny_config(tiny_model_dir, tmp_path, "nan-loss", "train.max_steps=4"))
    nan_loss_at(trainer, {2}, monkeypatch)
    steps = StepRecorder(trainer)
    trainer.fit()

    assert steps.unchanged(2)  # the faulty step left every weight bit for bit as it was
    assert not all(steps.unchanged(s) for s in (1, 3, 4))  # the others did train
    assert adam_steps(trainer) == 3  # 4 steps, one optimizer step skipped
    lines = step_metrics(trainer.run.run_dir)
    assert [m["nonfinite_skipped"] for m in lines] == [0.0, 1.0, 0.0, 0.0]
    assert read_status(trainer.run.run_dir)["state"] == "finished"
    add("numerical_faults", faults_injected=1, updates_skipped=1, runs_continued=1)


def test_a_nan_gradient_with_a_finite_loss_skips_that_update(
    tiny_model_dir, tmp_path, restore_threads
) -> None:
    trainer = Trainer(tiny_config(tiny_model_dir, tmp_path, "nan-grad", "train.max_steps=3"))
    steps = StepRecorder(trainer)
    # A backward hook on one weight turns its gradient into NaNs during step 2 only.
    weight = next(p for p in trainer.model.parameters() if p.requires_grad)
    hook = weight.register_hook(lambda grad: grad * float("nan") if trainer.step + 1 == 2 else grad)
    try:
        trainer.fit()
    finally:
        hook.remove()
    lines = step_metrics(trainer.run.run_dir)
    assert math.isfinite(lines[1]["policy_loss"])  # the loss itself was fine
    assert not math.isfinite(lines[1]["grad_norm"])  # the gradient was not
    assert [m["nonfinite_skipped"] for m in lines] == [0.0, 1.0, 0.0]
    assert steps.unchanged(2)
    assert adam_steps(trainer) == 2
    assert read_status(trainer.run.run_dir)["state"] == "finished"
    add("numerical_faults", faults_injected=1, updates_skipped=1, runs_continued=1)


def test_repeated_nonfinite_steps_trip_the_health_gate(
    tiny_model_dir, tmp_path, monkeypatch, restore_threads
) -> None:
    # health.nonfinite.max_consecutive is 2: the third bad step in a row (steps 2, 3, 4) stops.
    cfg = tiny_config(
        tiny_model_dir, tmp_path, "nan-streak", "train.max_steps=6", "health.warmup_steps=0"
    )
    trainer = Trainer(cfg)
    nan_loss_at(trainer, {2, 3, 4, 5, 6}, monkeypatch)
    steps = StepRecorder(trainer)
    with pytest.raises(HealthStop) as caught:
        trainer.fit()
    assert caught.value.event.rule == "nonfinite" and caught.value.event.step == 4
    run_dir = trainer.run.run_dir
    health = read_health(run_dir)
    assert health["status"] == "stopped" and health["stopped_by"]["rule"] == "nonfinite"
    status = read_status(run_dir)
    # the run's work is kept as a checkpoint of its last step (never a non-finite update: steps
    # 2-4 were skipped), not as a final model
    ckpt = run_dir / "checkpoints" / "step_000004"
    assert status | {"time": 0} == {
        "state": "stopped_by_health",
        "rule": "nonfinite",
        "checkpoint": f"checkpoint of step 4: {ckpt}",
        "time": 0,
    }
    assert (ckpt / "COMPLETE").exists() and not (run_dir / "final").exists()
    assert [m["step"] for m in step_metrics(run_dir)] == [1, 2, 3, 4]
    assert all(steps.unchanged(s) for s in (2, 3, 4))
    add("numerical_faults", faults_injected=3, updates_skipped=3, health_stops=1)


def test_rlvr_train_exits_3_when_the_health_gate_stops_it(
    tiny_model_dir, tmp_path, monkeypatch, capsys, restore_threads
) -> None:
    real = Objective.loss
    monkeypatch.setattr(
        Objective,
        "loss",
        lambda self, *a: (lambda loss, st: (loss * float("nan"), st))(*real(self, *a)),
    )
    argv = ["train", *tiny_overrides(tiny_model_dir, tmp_path, "cli-streak"),
            "train.max_steps=5", "health.warmup_steps=0"]  # fmt: skip
    assert cli_main(argv) == 3
    err = capsys.readouterr().err
    assert "stopped by the health gate: rule 'nonfinite' at step 3" in err
    health = json.loads((Path(tmp_path) / "cli-streak" / "health.json").read_text())
    assert health["stopped_by"]["rule"] == "nonfinite"
    add("numerical_faults", faults_injected=3, updates_skipped=3, health_stops=1)
