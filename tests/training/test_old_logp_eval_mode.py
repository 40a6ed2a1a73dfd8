"""The no-grad pass of the step (old log-probs: the proximal policy of the ratio, the trainer
side of the rollout correction and of the engine trust check) scores the batch with the policy
itself, dropout off, as the engine sampled it: a rollout engine (vLLM, a server) has no dropout.
The update leaves the model in train mode, so without an explicit eval mode the pass of every
step after the first would draw dropout masks (``model.lora.dropout``, or a model's own dropout)
and the correction weights and the trust check would read noise."""

from __future__ import annotations

import pytest
import torch
from staleness_engines import WorkerEngine
from test_staleness import COMMON, _completion_logp
from test_train_e2e import tiny_config

import rlvr.training.setup as setup_mod
import rlvr.training.step as step_mod
from rlvr.training.trainer import Trainer


def test_old_logprobs_are_scored_without_dropout_after_an_update(
    tiny_model_dir, tmp_path, monkeypatch
):
    cfg = tiny_config(
        tiny_model_dir,
        tmp_path,
        *COMMON,
        "model.lora.enabled=true",
        "model.lora.rank=4",
        "model.lora.alpha=64",
        "model.lora.dropout=0.5",
        "algo.tis_cap=2",  # the correction needs the old log-prob pass
        "train.lr=3e-2",
        "train.max_steps=3",
    )
    monkeypatch.setattr(
        setup_mod, "build_engine", lambda cfg, model, tok, *a, **k: WorkerEngine(model, tok)
    )
    gaps: list[float] = []
    real_prepare = step_mod.Step.prepare

    def spy(self, batch):
        model = self.state.model
        mode = model.training
        model.eval()
        with torch.no_grad():
            ref = [
                _completion_logp(model, batch.seq_prompt_ids[i], c.token_ids)
                for i, c in enumerate(batch.completions)
            ]
        model.train(mode)
        gaps.append(
            max(float((o - r).abs().max()) for o, r in zip(batch.old_logp, ref, strict=True))
        )
        return real_prepare(self, batch)

    monkeypatch.setattr(step_mod.Step, "prepare", spy)
    trainer = Trainer(cfg)
    trainer.fit()
    assert len(gaps) == 3
    assert gaps == pytest.approx([0.0] * 3, abs=1e-5)
