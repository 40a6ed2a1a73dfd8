"""What the step reports and prepares per objective: the advantages the loss really uses
(listwise MaxEnt) and PPO's whitened GAE advantages."""

from __future__ import annotations

import pytest
import torch
from tests.training.test_train_e2e import tiny_config

from rlvr.algorithms import gae_advantages, maxent_weights
from rlvr.training.trainer import Trainer


def _one_step(tiny_model_dir, tmp_path, *overrides: str) -> tuple[Trainer, dict]:
    cfg = tiny_config(
        tiny_model_dir,
        tmp_path,
        "algo.group_size=4",
        "algo.prompts_per_step=4",
        "model.autocast=off",
        "eval.before_after=false",
        *overrides,
    )
    trainer = Trainer(cfg)
    metrics = trainer.train_step()
    trainer.run.close()
    return trainer, metrics


def test_listwise_reports_its_own_advantages(tiny_model_dir, tmp_path):
    """adv_* of maxent_listwise are the clip term's w - 1/K, not Dr.GRPO's r - mean(r)."""
    trainer, m = _one_step(tiny_model_dir, tmp_path, "algo.objective=maxent_listwise")
    scores = trainer.last_batch.scores
    mx = trainer.cfg.algo.maxent
    _, w = maxent_weights(scores, torch.zeros_like(scores), mx.tau, 0.0, mx.q_temperature, mx.q_eps)
    adv = (w - 0.25).reshape(-1)
    assert scores.std() > 0  # some group had mixed rewards
    assert m["adv_min"] == pytest.approx(float(adv.min()), abs=1e-6)
    assert m["adv_max"] == pytest.approx(float(adv.max()), abs=1e-6)
    assert m["adv_std"] == pytest.approx(float(adv.std(unbiased=False)), abs=1e-6)
    assert m["adv_mean"] == pytest.approx(0.0, abs=1e-6)  # the weights of a group sum to 1
    drgrpo = scores - scores.mean(dim=1, keepdim=True)
    assert m["adv_max"] != pytest.approx(float(drgrpo.max()), abs=1e-3)


@pytest.mark.parametrize("whiten", [True, False])
def test_ppo_advantages_are_whitened_by_default(tiny_model_dir, tmp_path, whiten):
    trainer, _ = _one_step(
        tiny_model_dir,
        tmp_path,
        "algo.objective=ppo",
        f"algo.ppo.whiten_advantages={str(whiten).lower()}",
        "rollout.max_new_tokens=6",
    )
    batch = trainer.last_batch
    lengths = [len(c) for c in batch.comp_ids]
    tokens = torch.cat([a[:n] for a, n in zip(batch.advantages, lengths, strict=True)])
    # the raw GAE advantages, recomputed by hand from the batch's rewards and critic values
    mask = batch.token_mask()
    rewards = torch.zeros_like(mask)
    for i, n in enumerate(lengths):
        rewards[i, n - 1] = batch.scores.reshape(-1)[i]
    values = torch.zeros_like(mask)
    for i, v in enumerate(batch.values):
        values[i, : len(v)] = v
    ppo = trainer.cfg.algo.ppo
    raw, _ = gae_advantages(rewards, values, mask, ppo.gamma, ppo.lam)
    raw_tokens = raw[mask.bool()]
    if whiten:
        assert float(tokens.mean()) == pytest.approx(0.0, abs=1e-5)
        assert float(tokens.std(unbiased=False)) == pytest.approx(1.0, abs=1e-4)
        expected = (raw_tokens - raw_tokens.mean()) / raw_tokens.std(unbiased=False)
        torch.testing.assert_close(tokens, expected, rtol=1e-4, atol=1e-4)
    else:
        torch.testing.assert_close(tokens, raw_tokens, rtol=1e-6, atol=1e-6)
