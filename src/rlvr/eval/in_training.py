"""Evaluation during training: before/after on the held-out split and scheduled evals.

The run loop calls only ``before()``, ``at_step(step, last)`` and reads ``stop_reason``.
"""

from __future__ import annotations

import json
import time

from rlvr.eval.evaluator import EvalMode, evaluate

EVAL_SET = "heldout"


class InTrainingEvaluator:
    def __init__(self, trainer):
        self.trainer = trainer
        self.cfg = trainer.cfg
        self.ctx = trainer.ctx
        self.stop_reason: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.ctx.eval_rows)

    def _run(self, step: int) -> dict:
        cfg, ctx = self.cfg, self.ctx
        t = time.perf_counter()
        scores, records = evaluate(
            self.trainer.engine,
            self.trainer.tokenizer,
            ctx.eval_rows[: cfg.eval.max_problems],
            ctx.rewards,
            template=cfg.data.template,
            system_prompt=cfg.data.system_prompt,
            mode=EvalMode("greedy"),
            max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
            stop=tuple(cfg.rollout.stop),
        )
        out = ctx.run_dir / "eval" / f"step_{step:06d}.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(
            json.dumps(
                {"step": step, "set": EVAL_SET, "scores": scores, "records": records}, indent=1
            )
        )
        metrics = {f"eval/{EVAL_SET}/{k}": v for k, v in scores.items()}
        metrics["time_eval"] = time.perf_counter() - t
        return metrics

    def before(self) -> dict:
        """Metrics of the evaluation before the first step ({} when not configured)."""
        if not (self.enabled and self.cfg.eval.before_after):
            return {}
        return self._run(0)

    def at_step(self, step: int, last: bool) -> dict:
        """Metrics of a scheduled (or final) evaluation at ``step``, else {}."""
        if not self.enabled:
            return {}
        scheduled = self.cfg.eval.every and step % self.cfg.eval.every == 0
        if scheduled or (last and self.cfg.eval.before_after):
            return self._run(step)
        return {}
