"""`Trainer`: one RL fine-tuning run, built from a config.

    trainer = Trainer(load_config("run.yaml"))   # or Trainer(cfg, model=m, tokenizer=t)
    summary = trainer.fit()                      # steps, evals, checkpoints: see run_loop

The pieces: `run_setup` builds everything (data, model, engine, rewards, objective, optimizer),
`TrainState` holds what a checkpoint saves, `Step` runs one step's phases, `run_loop` owns the
step counter, evaluations, checkpoints and the health gate.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlvr.algorithms import AdaptiveKLController, FixedKLController
from rlvr.config import Config
from rlvr.distributed import DistInfo
from rlvr.model.forward import completion_logits
from rlvr.model.logprobs import completion_logprobs
from rlvr.objectives.batch import RolloutBatch
from rlvr.training.batching import PromptSampler
from rlvr.training.setup import RunContext, setup_run
from rlvr.training.state import TrainState
from rlvr.training.step import Step


class Trainer:
    """One run. ``Trainer(cfg).fit()`` returns a summary dict; ``train_step()`` runs one step
    (the loop then moves ``state.step``). Pass ``model``/``tokenizer`` (and a VLM's
    ``processor``) to train an already-loaded model (notebooks, tests)."""

    def __init__(
        self,
        cfg: Config,
        *,
        model=None,
        tokenizer=None,
        processor=None,
        run_dir: Path | None = None,
    ):
        self.cfg = cfg
        self.ctx: RunContext = setup_run(
            cfg, model=model, tokenizer=tokenizer, processor=processor, run_dir=run_dir
        )
        c, a = self.ctx, cfg.algo
        self.dist: DistInfo = c.dist
        self.objective = c.objective
        self.state = TrainState(
            model=c.model,
            optimizer=c.optimizer,
            scheduler=c.scheduler,
            sampler=PromptSampler(len(c.train_rows), a.prompts_per_step, seed=cfg.train.seed),
            kl_ctl=AdaptiveKLController(a.beta, a.kl_target, a.kl_horizon)
            if a.kl_target is not None
            else FixedKLController(a.beta),
            objective=c.objective,
        )
        self.step_fn = Step(
            cfg,
            state=self.state,
            objective=c.objective,
            engine=c.engine,
            rewards=c.rewards,
            tokenizer=c.tokenizer,
            train_rows=c.train_rows,
            train_model=c.train_model,
            ref_logp_fn=self._reference_logp,
            named_weights=c.named_weights,
            dist=c.dist,
            autocast=c.autocast,
            device=c.device,
            processor=c.processor,
        )
        self.last_batch: RolloutBatch | None = None
        self.history: list[dict] = []

    @property
    def model(self) -> torch.nn.Module:
        return self.ctx.model

    @property
    def tokenizer(self):
        return self.ctx.tokenizer

    @property
    def engine(self):
        return self.ctx.engine

    @property
    def step(self) -> int:
        """Steps completed (the run loop moves it)."""
        return self.state.step

    def train_step(self) -> dict:
        """Generate, score, update and sync once; returns the step's metrics (with the
        trainable and total parameter counts)."""
        metrics, self.last_batch = self.step_fn.run()
        return {**metrics, **self.ctx.param_counts}

    def fit(self) -> dict:
        """Train for ``train.max_steps`` steps with evals around it; returns the summary."""
        from rlvr.training.loop import run_training

        return run_training(self)

    def _reference_logp(self, sb, temperature: float) -> torch.Tensor:
        """Log-probs of the frozen reference: a copy of the initial model, or with LoRA the
        base model with its adapters disabled."""
        with self.step_fn.autocast():
            if self.ctx.ref_model is not None:
                logits = completion_logits(self.ctx.ref_model, sb)
            else:
                with self.model.disable_adapter():
                    logits = completion_logits(self.model, sb)
        return completion_logprobs(logits, sb, temperature, entropy=False)[0]
