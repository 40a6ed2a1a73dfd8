"""Episodes under several processes: torchrun with 2 CPU ranks (DDP, gloo) against 1 process.

Each rank plays the episodes of its own prompts. With per-prompt sampling seeds every episode's
turns must be drawn the same whatever the rank holding it and whichever other episodes are still
live beside it, so the 2-rank run logs the same episode metrics as the 1-process run and ends
with the same weights (up to float32 summation order, as tests/training/test_distributed.py).
"""

from __future__ import annotations

import pytest
from tests.training.dist_support import ONE, TORCHRUN, run, steps, train_args, weights

ATOL = 1e-5
EPISODES = (
    "env.name=user_envs:CountDown",
    "env.kwargs.start=3",
    "rollout.max_turns=3",
    "rollout.max_episode_tokens=40",
    "data.max_prompt_tokens=64",
    "train.parallel=ddp",
)


def test_two_ranks_play_the_same_episodes_as_one_process(tiny_model_dir, tmp_path):
    def args(name: str) -> list[str]:
        return train_args(tiny_model_dir, tmp_path, name, 2, *EPISODES)

    run(ONE, args("one"), tmp_path)
    run(TORCHRUN, args("two"), tmp_path)
    s1, s2 = steps(tmp_path / "one"), steps(tmp_path / "two")
    assert [m["step"] for m in s2] == [1, 2]
    for a, b in zip(s1, s2, strict=True):
        # several turns were played, and episodes ended after different turns: a rank's live
        # episodes differ from the one process's, which must not change what any episode draws
        assert 1.0 < a["turns_mean"] < 3.0
        for key in ("turns_mean", "episode_model_tokens_mean", "episode_env_tokens_mean"):
            assert a[key] == b[key], key
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    w1, w2 = weights(tmp_path / "one" / "final"), weights(tmp_path / "two" / "final")
    worst = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    assert worst < ATOL, f"max weight difference {worst}"
