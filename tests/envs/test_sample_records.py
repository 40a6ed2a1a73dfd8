"""samples/step_N.jsonl records of episodes: the reward and validity the step trained on (the
environment's reward where it gives it, a failed environment invalid), not the reward specs'
score of the last turn."""

from __future__ import annotations

from rlvr.objectives.batch import RolloutBatch
from rlvr.rewards.runner import BatchRewards
from rlvr.rollout.base import Completion, EpisodeInfo
from rlvr.training.loop import sample_records


def _episode(reward: float | None, gives: bool | None, failed: str = "") -> Completion:
    info = EpisodeInfo(turns=2, env_reward=reward, gives_reward=gives, failed=failed)
    return Completion(0, [1, 2, 3], [0.0] * 3, "abc", "stop", loss_mask=[1, 0, 1], episode=info)


def test_episode_records_carry_the_score_the_step_trained_on():
    comps = [
        _episode(1.5, True),  # the environment scores: 1.5, whatever the specs said
        _episode(None, True),  # it scores and gave nothing: 0
        _episode(None, False),  # the specs score the last turn: 0.25 stays
        _episode(2.0, True, failed="step: boom"),  # failed: invalid, 0
    ]
    batch = RolloutBatch([{"answer": "7"}], ["p"], [[9]], [comps], 4)
    batch.rewards = BatchRewards([0.25, 0.25, 0.25, 0.25], [{}] * 4, [True] * 4, [])
    recs = sample_records(batch)
    assert [r["reward"] for r in recs] == [1.5, 0.0, 0.25, 0.0]
    assert [r["valid"] for r in recs] == [True, True, True, False]
    assert [r["env_reward"] for r in recs] == [1.5, None, None, 2.0]
