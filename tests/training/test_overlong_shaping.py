"""reward.overlong_buffer / overlong_factor (DAPO soft overlong punishment, arXiv 2503.14476) in
the loop: added to every objective's reward."""

from __future__ import annotations

import pytest
from test_train_e2e import tiny_config

from rlvr.config import load_config
from rlvr.training.preflight.checks import config_problems
from rlvr.training.trainer import Trainer


@pytest.mark.parametrize("objective", ["drgrpo", "cispo"])
def test_penalty_is_added_to_the_reward(tiny_model_dir, tmp_path, objective):
    """Reward constant 1, max_new_tokens 8, buffer 4, factor 0.5: a reply of L tokens scores
    1 - 0.5 * clamp(L - 4, 0, 4) / 4: L <= 4 -> 1, L = 6 -> 0.75, L = 8 (the limit) -> 0.5."""
    cfg = tiny_config(
        tiny_model_dir,
        tmp_path,
        f"algo.objective={objective}",
        "reward.specs=[{name: 'toy_rewards:always_one'}]",
        "reward.overlong_buffer=4",
        "reward.overlong_factor=0.5",
        "train.max_steps=1",
        "eval.before_after=false",
    )
    trainer = Trainer(cfg)
    m = trainer.train_step()
    batch = trainer.last_batch
    trainer.run.close()
    lengths = [len(c) for c in batch.comp_ids]
    expected = [1 - 0.5 * min(max(n - 4, 0), 4) / 4 for n in lengths]
    assert batch.scores.reshape(-1).tolist() == pytest.approx(expected, abs=1e-6)
    assert 8 in lengths  # a random model rarely stops early: some replies hit the limit (0.5)
    mean = sum(expected) / len(expected)
    assert m["reward_mean"] == pytest.approx(mean, abs=1e-6)
    assert m["overlong_penalty_mean"] == pytest.approx(mean - 1, abs=1e-6)


def test_buffer_longer_than_the_generation_budget_is_refused():
    cfg = load_config(None, ["rollout.max_new_tokens=8", "reward.overlong_buffer=9"])
    assert any(
        p.startswith("reward.overlong_buffer=9 must be <= rollout.max_new_tokens=8")
        for p in config_problems(cfg)
    )
