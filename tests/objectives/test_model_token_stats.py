"""Token statistics of an episode count the model's tokens only (loss mask 1), never the
environment's: one batch method (RolloutBatch.model_token_values) every statistic selects with."""

from __future__ import annotations

import pytest
import torch

from rlvr.config import load_config
from rlvr.objectives.batch import RolloutBatch
from rlvr.objectives.distill import Distill
from rlvr.rollout.base import Completion
from rlvr.training.step_metrics import advantage_stats

# one episode of 9 tokens: model, model, env x4, model x3 (5 model tokens, 4 environment ones)
MASK = [1, 1, 0, 0, 0, 0, 1, 1, 1]


def _episode_batch() -> RolloutBatch:
    comps = [
        Completion(0, [1] * 9, [0.0] * 9, "", "stop", loss_mask=MASK),
        Completion(0, [1] * 2, [0.0] * 2, "", "stop"),
    ]
    batch = RolloutBatch([{}], ["p"], [[1]], [comps], group_size=2)
    batch.valid = torch.tensor([[True, True]])
    return batch


def test_model_token_values_select_the_model_tokens_of_valid_sequences():
    batch = _episode_batch()
    values = [torch.arange(9.0), torch.tensor([10.0, 11.0])]
    assert batch.model_token_values(values).tolist() == [0.0, 1.0, 6.0, 7.0, 8.0, 10.0, 11.0]
    batch.valid = torch.tensor([[False, True]])
    assert batch.model_token_values(values).tolist() == [10.0, 11.0]
    # per sequence: the mean over its model tokens (sequence 0: (0 + 1 + 6 + 7 + 8) / 5 = 4.4)
    assert batch.model_token_means(values).tolist() == pytest.approx([4.4, 10.5])


def test_distill_reverse_kl_counts_the_model_tokens_only():
    # the student agrees with the teacher on every model token (0 nats) and puts -7 on the
    # environment's 4 tokens, which it did not sample: over all 9 tokens the mean would be
    # 4 * -7 / 9 = -3.11; over the model's, 0.0
    batch = _episode_batch()
    student = torch.zeros(9)
    student[torch.tensor(MASK) == 0] = -7.0
    batch.old_logp = [student, torch.zeros(2)]
    obj = Distill(load_config(None, ["algo.objective=distill", "algo.teacher.name_or_path=t"]))
    obj.teacher_logprobs = lambda b: [torch.zeros(9), torch.zeros(2)]
    stats = obj.prepare(batch)
    assert stats["distill_reverse_kl"] == pytest.approx(0.0)
    assert stats["distill_teacher_logp_mean"] == pytest.approx(0.0)


def test_advantage_statistics_count_the_model_tokens_only():
    # token advantages 1 on the model's tokens, 10 on the environment's: every sequence's
    # advantage is 1 over the model's tokens (over all of sequence 0's it would be 49 / 9)
    batch = _episode_batch()
    adv0 = torch.where(torch.tensor(MASK) == 1, 1.0, 10.0)
    batch.advantages = [adv0, torch.ones(2)]
    st = advantage_stats(batch)
    assert (st["adv_mean"], st["adv_std"], st["adv_min"], st["adv_max"]) == pytest.approx(
        (1.0, 0.0, 1.0, 1.0)
    )
