"""InTrainingEvaluator on scripted metric sequences: schedule, best step, early stop, resume.

The expensive part (`_evaluate`: generation and grading) is replaced by a script of scores, so
these tests exercise exactly the bookkeeping the run loop relies on.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlvr.config import load_config
from rlvr.eval.in_training import InTrainingEvaluator

HELDOUT = "eval/heldout/greedy_pass@1"
OOD = "eval/ood/greedy_pass@1"


class FakeModel:
    """Stands in for the policy: `save_pretrained` records which step's weights were saved."""

    def __init__(self) -> None:
        self.step = 0

    def save_pretrained(self, path: Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "weights.txt").write_text(f"step {self.step}")


def make_evaluator(tmp_path: Path, *overrides: str) -> InTrainingEvaluator:
    cfg = load_config(None, list(overrides))
    tmp_path.mkdir(parents=True, exist_ok=True)  # a run directory exists before training
    rows = [{"prompt": f"p{i}", "answer": str(i)} for i in range(4)]
    return InTrainingEvaluator(
        cfg,
        run_dir=tmp_path,
        engine=None,
        tokenizer=SimpleNamespace(save_pretrained=lambda path: None),
        rewards=None,
        model=FakeModel(),
        heldout_rows=rows,
        train_rows=rows,
    )


def script(evaluator: InTrainingEvaluator, values: dict[int, dict[str, float]]) -> list[int]:
    """Make `_evaluate(step)` return values[step]; returns the list of evaluated steps."""
    evaluated: list[int] = []

    def fake(step: int) -> dict:
        evaluated.append(step)
        evaluator.model.step = step
        return dict(values[step])

    evaluator._evaluate = fake  # type: ignore[method-assign]
    return evaluated


def drive(evaluator: InTrainingEvaluator, first: int, last: int, max_steps: int) -> int | None:
    """What the run loop does for steps first..last; returns the step it would stop at."""
    for step in range(first, last + 1):
        evaluator.at_step(step, step == max_steps)
        if evaluator.stop_reason:
            return step
    return None


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ([], [0, 5]),  # the default: before and after only
        (["eval.every=2"], [0, 2, 4, 5]),
        (["eval.every=2", "eval.before_after=false"], [2, 4]),
        (["eval.before_after=false"], []),
    ],
)
def test_schedule(tmp_path: Path, overrides: list[str], expected: list[int]) -> None:
    ev = make_evaluator(tmp_path, *overrides)
    evaluated = script(ev, {s: {HELDOUT: 0.5} for s in range(6)})
    ev.before()
    drive(ev, 1, 5, max_steps=5)
    assert evaluated == expected


def test_early_stop_after_two_consecutive_drops_and_best_step(tmp_path: Path) -> None:
    ev = make_evaluator(tmp_path, "eval.every=1", "eval.early_stop.enabled=true")
    # 0.25 -> 0.5 -> 0.75 (best) -> 0.5 (drop 1) -> 0.625 (up: reset) -> 0.5 (drop 1)
    # -> 0.25 (drop 2 = patience): stop after step 6
    values = [0.25, 0.5, 0.75, 0.5, 0.625, 0.5, 0.25, 0.9]
    script(ev, {s: {HELDOUT: v} for s, v in enumerate(values)})
    ev.before()
    assert drive(ev, 1, 7, max_steps=7) == 6
    assert ev.best_step == 2
    reason = ev.stop_reason
    assert HELDOUT in reason and "2 times in a row" in reason
    assert "0.625 (step 4) -> 0.5 (step 5) -> 0.25 (step 6)" in reason
    assert "eval.early_stop.patience=2" in reason
    assert json.loads((tmp_path / "best.json").read_text()) == {
        "metric": HELDOUT,
        "step": 2,
        "value": 0.75,
    }


def test_min_delta_ignores_small_drops(tmp_path: Path) -> None:
    ev = make_evaluator(
        tmp_path, "eval.every=1", "eval.early_stop.enabled=true", "eval.early_stop.min_delta=0.1"
    )
    # each step falls by 0.05 < min_delta 0.1: no drop counts, training goes on
    script(ev, {s: {HELDOUT: 0.8 - 0.05 * s} for s in range(6)})
    ev.before()
    assert drive(ev, 1, 5, max_steps=5) is None
    assert ev.best_step == 0  # the baseline was the best eval


def test_disabled_early_stop_never_stops_but_best_is_kept(tmp_path: Path) -> None:
    ev = make_evaluator(tmp_path, "eval.every=1")
    script(ev, {s: {HELDOUT: 1.0 - 0.2 * s} for s in range(5)})
    ev.before()
    assert drive(ev, 1, 4, max_steps=4) is None
    assert ev.best_step == 0


def test_best_and_early_stop_follow_their_own_metrics(tmp_path: Path) -> None:
    ev = make_evaluator(
        tmp_path,
        "eval.every=1",
        "eval.sets=[{name: heldout}, {name: ood, split: train}]",
        f"eval.best_metric={OOD}",
        "eval.early_stop.enabled=true",
        f"eval.early_stop.metric={HELDOUT}",
        "eval.early_stop.patience=1",
        "eval.save_best=true",
    )
    # OOD: 0.5, 0.75, 0.75 (tie keeps step 1), 0.25; held-out falls at step 3 (patience 1)
    values = {
        0: {HELDOUT: 0.5, OOD: 0.5},
        1: {HELDOUT: 0.5, OOD: 0.75},
        2: {HELDOUT: 0.5, OOD: 0.75},
        3: {HELDOUT: 0.25, OOD: 0.25},
    }
    script(ev, values)
    ev.before()
    assert drive(ev, 1, 3, max_steps=10) == 3
    assert ev.best_step == 1
    best = json.loads((tmp_path / "best.json").read_text())
    assert (best["metric"], best["step"], best["value"]) == (OOD, 1, 0.75)
    # the saved best model is the one of step 1, not overwritten by later, worse evals
    assert (tmp_path / "best" / "weights.txt").read_text() == "step 1"
    assert best["model"] == str(tmp_path / "best")


def test_resumed_run_continues_the_early_stopping_count(tmp_path: Path) -> None:
    values = {s: {HELDOUT: v} for s, v in enumerate([0.25, 0.75, 0.5, 0.625, 0.5, 0.25, 0.1])}
    overrides = ("eval.every=1", "eval.early_stop.enabled=true")

    straight = make_evaluator(tmp_path / "a", *overrides)
    script(straight, values)
    straight.before()
    stop_straight = drive(straight, 1, 6, max_steps=6)

    first = make_evaluator(tmp_path / "b", *overrides)
    script(first, values)
    first.before()
    assert drive(first, 1, 4, max_steps=6) is None  # step 4 is one drop (0.625 -> 0.5)
    saved = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it

    resumed = make_evaluator(tmp_path / "b", *overrides)
    evaluated = script(resumed, values)
    resumed.load_state_dict(saved)
    assert resumed.before(4) == {}  # a resumed run has its baseline already
    stop_resumed = drive(resumed, 5, 6, max_steps=6)
    # without the restored history step 5 would be the first eval seen (no drop); with it,
    # 0.625 (step 3) -> 0.5 (step 4) -> 0.25 (step 5) is the second drop in a row
    assert stop_straight == stop_resumed == 5
    assert evaluated == [5]
    assert resumed.stop_reason == straight.stop_reason
    assert resumed.best_step == straight.best_step == 1


def test_changed_early_stop_metric_on_resume_starts_a_fresh_count(tmp_path: Path) -> None:
    old = make_evaluator(tmp_path, "eval.every=1", "eval.early_stop.enabled=true")
    script(old, {0: {HELDOUT: 0.5}, 1: {HELDOUT: 0.25}})
    old.before()
    drive(old, 1, 1, max_steps=9)
    new = make_evaluator(
        tmp_path,
        "eval.every=1",
        "eval.sets=[{name: heldout}, {name: ood, split: train}]",
        "eval.early_stop.enabled=true",
        f"eval.early_stop.metric={OOD}",
    )
    new.load_state_dict(old.state_dict())
    assert new.stopper.history == []
    assert new.best_step == 0  # the best held-out eval (0.5 at step 0) is the same metric: kept


def test_a_missing_best_metric_is_an_error_naming_what_was_logged(tmp_path: Path) -> None:
    ev = make_evaluator(tmp_path)
    script(ev, {0: {"eval/other/greedy_pass@1": 1.0}})
    with pytest.raises(ValueError, match=r"missing from the eval at step 0 \(got \['eval/other"):
        ev.before()
