"""KL in the loop: the adaptive controller moves by the batch's sample count, and KL as a reward
penalty uses the configured estimator."""

from __future__ import annotations

import json

import pytest
import torch
from test_train_e2e import tiny_config

from rlvr.objectives.batch import RolloutBatch
from rlvr.training.step import kl_penalty
from rlvr.training.trainer import Trainer


def test_adaptive_kl_moves_by_the_number_of_sequences(tiny_model_dir, tmp_path):
    """Ziegler et al. 2019 (arXiv 1909.08593): coef *= 1 + clip(kl / target - 1, +-0.2) * n / H
    with n the samples of the batch. 4 prompts x 4 samples = 16 sequences, horizon 32: each
    step moves the coefficient by up to 10%. (A bug passed n = 1: 0.6% per step at most.)"""
    cfg = tiny_config(
        tiny_model_dir,
        tmp_path,
        "algo.beta=0.1",
        "algo.kl_target=0.001",
        "algo.kl_horizon=32",
        "algo.group_size=4",
        "algo.prompts_per_step=4",
        "train.lr=1e-2",
        "train.max_steps=3",
        "eval.before_after=false",
    )
    trainer = Trainer(cfg)
    trainer.fit()
    text = (trainer.run.run_dir / "metrics.jsonl").read_text()
    rows = [json.loads(line) for line in text.splitlines()]
    assert rows[0]["kl_coef"] == pytest.approx(0.1)  # the starting coefficient is used at step 1
    for prev, cur in zip(rows, rows[1:], strict=False):
        error = min(max(prev["kl"] / 0.001 - 1.0, -0.2), 0.2)
        assert cur["kl_coef"] == pytest.approx(prev["kl_coef"] * (1 + error * 16 / 32), rel=1e-6)
    # step 1 starts at the reference (KL 0: error -0.2, coefficient x0.9); later steps drift
    assert rows[1]["kl_coef"] == pytest.approx(0.09, rel=1e-6)


def _batch(old: list[list[float]], ref: list[list[float]]) -> RolloutBatch:
    b = RolloutBatch(rows=[{}], prompt_texts=["p"], prompt_ids=[[1]], groups=[[]], group_size=2)
    b.old_logp = [torch.tensor(x) for x in old]
    b.ref_logp = [torch.tensor(x) for x in ref]
    return b


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        # x = logp - ref per token: sequence 1 has x = (0.5, -1.0), sequence 2 has x = (2.0,)
        ("k1", [0.5 - 1.0, 2.0]),
        ("k2", [0.5 * 0.25 + 0.5 * 1.0, 0.5 * 4.0]),
        # k3 = exp(-x) + x - 1
        ("k3", [(0.60653066 + 0.5 - 1) + (2.71828183 - 1.0 - 1), 0.13533528 + 2.0 - 1]),
    ],
)
def test_kl_reward_penalty_uses_the_configured_estimator(kind, expected):
    batch = _batch(old=[[-1.0, -3.0], [-0.5]], ref=[[-1.5, -2.0], [-2.5]])
    got = kl_penalty(batch, kind)
    assert got.shape == (1, 2)
    torch.testing.assert_close(got.view(-1), torch.tensor(expected), rtol=1e-6, atol=1e-6)
