"""Evaluation during training: named sets before, on schedule and after; best step; early stop.

The run loop calls ``before()``, ``at_step(step, last)`` (each returns the metrics to log, or
{}) and reads ``stop_reason`` after every step; a checkpoint saves ``state_dict()`` and a
resumed run restores it with ``load_state_dict()``. Per eval it writes
``RUN_DIR/eval/step_<step>.json`` (results and per-problem records, the same format as
``rlvr eval``) and, whenever the chosen metric reaches a new best, ``RUN_DIR/best.json``.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rlvr.config import Config
from rlvr.eval.early_stop import EarlyStopper
from rlvr.eval.engine import evaluate_config_sets, training_eval_engine
from rlvr.eval.evaluator import EvalSet, eval_payload, write_eval_file
from rlvr.eval.sets import build_eval_sets
from rlvr.jsonio import atomic_write_text, open_up_files

BEST_FILE = "best.json"
BEST_DIR = "best"


class InTrainingEvaluator:
    """Scheduled evaluations of one run, from explicit parts (no trainer).

    ``sync`` is called before every evaluation: it gives the engine the weights of the step the
    evaluation is labelled with (the engine may lag behind with ``rollout.sync_every > 1``).
    """

    def __init__(
        self,
        cfg: Config,
        *,
        run_dir: Path,
        engine,
        tokenizer,
        rewards,
        model: torch.nn.Module,
        heldout_rows: list[dict],
        train_rows: list[dict],
        sync: Callable[[], object] = lambda: None,
        processor=None,
    ) -> None:
        self.cfg = cfg
        self.processor = processor  # a VLM's (its sets' rows may carry images)
        self.run_dir = Path(run_dir)
        self.engine, self.tokenizer, self.rewards, self.model = engine, tokenizer, rewards, model
        self.sync = sync
        ev = self.cfg.eval
        self.sets: list[EvalSet] = build_eval_sets(
            self.cfg, heldout_rows=lambda: heldout_rows, train_rows=lambda: train_rows
        )
        self.best_metric = ev.best_metric_name()
        self.best: dict | None = None  # {"metric", "step", "value"}
        self.stopper: EarlyStopper | None = None
        if ev.early_stop.enabled:
            self.stopper = EarlyStopper(
                ev.early_stop_metric_name(),
                mode="max",
                patience=ev.early_stop.patience,
                min_delta=ev.early_stop.min_delta,
            )
        self.stop_reason: str | None = None
        self.pending: int | None = None  # the step whose evaluation a stop signal skipped

    @property
    def enabled(self) -> bool:
        return bool(self.sets)

    @property
    def best_step(self) -> int | None:
        """Step of the best eval of ``best_metric`` so far (ties keep the earlier step)."""
        return None if self.best is None else self.best["step"]

    # ------------------------------------------------------------------ evaluation
    def _evaluate(self, step: int) -> dict:
        """Run every set; write eval/step_<step>.json; return ``eval/<set>/<metric>`` scores."""
        cfg = self.cfg
        t = time.perf_counter()
        self.sync()  # the engine holds the weights of this step (rollout.sync_every aside)
        # eval.dtype, eval.batch_size and the provenance record: rlvr.eval.engine
        engine = training_eval_engine(cfg, self.engine, self.model, self.tokenizer)
        outcome = evaluate_config_sets(
            engine, self.tokenizer, self.sets, self.rewards, cfg, self.processor
        )
        write_eval_file(
            self.run_dir / "eval" / f"step_{step:06d}.json",
            eval_payload(outcome, step=step),
        )
        metrics = outcome.metrics()
        metrics["time_eval"] = time.perf_counter() - t
        return metrics

    def _record(self, step: int, metrics: dict) -> None:
        """Update the best step and the early-stopping state from one eval's metrics."""
        if self.best_metric not in metrics:
            raise ValueError(
                f"eval.best_metric {self.best_metric!r} is missing from the eval at step {step} "
                f"(got {sorted(k for k in metrics if k.startswith('eval/'))})"
            )
        value = float(metrics[self.best_metric])
        if self.best is None or value > self.best["value"]:
            self.best = {"metric": self.best_metric, "step": step, "value": value}
            self._write_best()
        if self.stopper is None:
            return
        history = self.stopper.history
        if history and step <= history[-1][0]:
            return  # a resumed run re-evaluating a step it already counted
        if self.stopper.update(step, float(metrics[self.stopper.metric])):
            self.stop_reason = self._stop_sentence()

    def _stop_sentence(self) -> str:
        assert self.stopper is not None
        es = self.cfg.eval.early_stop
        # EarlyStopper.reason reads "stop: <metric> got worse ... -> v (step s); best ...".
        return (
            self.stopper.reason.removeprefix("stop: ").rstrip(".")
            + f" (eval.early_stop.patience={es.patience}, min_delta={es.min_delta:g})."
        )

    def _write_best(self, save_model: bool = True) -> None:
        run_dir = self.run_dir
        best = dict(self.best or {})
        if self.cfg.eval.save_best and save_model:
            best["model"] = str(self._save_best_model(run_dir / BEST_DIR))
        atomic_write_text(run_dir / BEST_FILE, json.dumps(best, indent=1))

    def _save_best_model(self, out: Path) -> Path:
        """The current model (or LoRA adapter) and tokenizer, replacing ``out`` atomically."""
        tmp = out.with_name(out.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        self.model.save_pretrained(tmp)
        (self.processor if self.processor is not None else self.tokenizer).save_pretrained(tmp)
        open_up_files(tmp)  # safetensors writes weights owner-only
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
        return out

    def _run(self, step: int) -> dict:
        metrics = self._evaluate(step)
        self._record(step, metrics)
        return metrics

    # ------------------------------------------------------------------ run-loop hooks
    def before(self, step: int = 0) -> dict:
        """Metrics of the evaluation before the first step ({} when not configured).

        A resumed run (``step`` > 0) already has its baseline and skips it.
        """
        if not (self.enabled and self.cfg.eval.before_after) or step > 0:
            return {}
        return self._run(0)

    def due(self, step: int, last: bool) -> bool:
        """Is an evaluation scheduled at ``step`` (``eval.every``, or the last step's)?"""
        if not self.enabled:
            return False
        every = self.cfg.eval.every
        return (every > 0 and step % every == 0) or (last and self.cfg.eval.before_after)

    def at_step(self, step: int, last: bool) -> dict:
        """Metrics of a scheduled (or final) evaluation at ``step``, else {}."""
        self.pending = None
        return self._run(step) if self.due(step, last) else {}

    def skip(self, step: int, last: bool) -> None:
        """A stop signal skipped (or cut short) ``step``'s evaluation: the checkpoint notes it
        (``state_dict``) and the resumed run runs it first."""
        self.pending = step if self.due(step, last) else None

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """Plain data for a checkpoint: the best eval and the early-stopping history."""
        return {
            "best": dict(self.best) if self.best else None,
            "early_stop": self.stopper.state_dict() if self.stopper else None,
            "pending": self.pending,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state_dict()``; a changed early-stop metric starts a fresh count."""
        self.pending = state.get("pending")
        best = state.get("best")
        if best is not None and best.get("metric") == self.best_metric:
            self.best = {
                "metric": best["metric"],
                "step": int(best["step"]),
                "value": float(best["value"]),
            }
        # best.json may name a step after the checkpoint, which the resumed run will redo.
        (self.run_dir / BEST_FILE).unlink(missing_ok=True)
        if self.best is not None:
            self._write_best(save_model=False)
        saved = state.get("early_stop")
        if self.stopper is None or saved is None:
            return
        try:
            self.stopper.load_state_dict(saved)
        except ValueError as exc:
            print(f"[rlvr] early stopping restarts its count: {exc}", flush=True)
            return
        if self.stopper.stopped:
            self.stop_reason = self._stop_sentence()
