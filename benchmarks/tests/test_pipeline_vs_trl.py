"""The loop comparison against TRL: the replayed rollouts and the statistics, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.studies.pipeline_trl_side import RolloutReplay
from benchmarks.studies.pipeline_vs_trl import difference, sample_stats, update_vectors

PROMPTS = {"P": [7, 8], "Q": [9]}


def tokenize(text: str) -> list[int]:
    return PROMPTS[text]


def test_replay_serves_each_prompt_its_own_replies_step_by_step():
    batches = [
        {"prompt_ids": [[7, 8], [7, 8], [9], [9]], "completion_ids": [[1], [2], [3], [4]]},
        {"prompt_ids": [[9], [7, 8]], "completion_ids": [[5, 2], [6]]},
    ]
    replay = RolloutReplay(batches, tokenize)
    # TRL asks in its own order: prompt Q's replies come out in the order rlvr recorded them
    first = replay(["Q", "P", "Q", "P"])
    assert first["prompt_ids"] == [[9], [7, 8], [9], [7, 8]]
    assert first["completion_ids"] == [[3], [1], [4], [2]]
    assert first["logprobs"] is None
    second = replay(["P", "Q"])
    assert second["completion_ids"] == [[6], [5, 2]]
    with pytest.raises(RuntimeError, match="asked for step 3; rlvr recorded 2"):
        replay(["P"])


def test_replay_refuses_a_batch_that_does_not_match():
    batch = [{"prompt_ids": [[7, 8], [9]], "completion_ids": [[1], [2]]}]
    with pytest.raises(RuntimeError, match="no recorded reply left for prompt 'P'"):
        RolloutReplay(batch, tokenize)(["P", "P"])
    with pytest.raises(RuntimeError, match="1 recorded replies were not asked for"):
        RolloutReplay(batch, tokenize)(["P"])


def test_update_vectors_subtract_the_initial_weights_on_common_tensors():
    init = {"w": torch.tensor([1.0, 2.0]), "only_init": torch.tensor([0.0])}
    a = {"w": torch.tensor([1.5, 2.0])}
    b = {"w": torch.tensor([0.5, 3.0]), "only_b": torch.tensor([1.0])}
    da, db = update_vectors(init, a, b)
    assert list(da) == list(db) == ["w"]
    assert da["w"].tolist() == [0.5, 0.0]
    assert db["w"].tolist() == [-0.5, 1.0]


def test_sample_stats_and_difference_by_hand():
    eos = 2
    records = [
        {"prompt_ids": [[7, 8], [7, 8]], "completion_ids": [[5, 2], [5, 5, 5, 5]]},
        {"prompt_ids": [[9]], "completion_ids": [[4, 4, 2]]},
    ]
    answers = {(7, 8): "5", (9,): "4"}

    def score(ids, answer):  # right when the first token is the answer
        return float(str(ids[0]) == answer)

    s = sample_stats(records, answers, score, eos)
    # lengths 2, 4, 3: mean 3, sample sd 1, se 1/sqrt(3); all three right; two end in EOS
    assert s["sequences"] == 3
    assert s["len_mean"] == pytest.approx(3.0)
    assert s["len_se"] == pytest.approx(1 / math.sqrt(3))
    assert s["reward_mean"] == pytest.approx(1.0)
    assert s["eos_share"] == pytest.approx(2 / 3)
    other = {"len_mean": 2.0, "len_se": math.sqrt(2 / 3)}
    d = difference(s, other)
    # se = sqrt(1/3 + 2/3) = 1; z = (3 - 2) / 1
    assert d == {
        "len_diff": pytest.approx(1.0),
        "len_diff_se": pytest.approx(1.0),
        "z": pytest.approx(1.0),
    }
