"""Micro-batches grouped by length: the packing by hand, and the update they give is the same."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tests.training.test_train_e2e import one_float32_step

from rlvr.objectives.micro_batches import length_micro_batches


def test_sequences_of_similar_length_share_a_micro_batch():
    # completions 5, 60, 6, 58: in order they pad to [[5, 60], [6, 58]]; by length to [[5, 6], [58, 60]]
    got = length_micro_batches([0, 1, 2, 3], [4, 4, 4, 4], [5, 60, 6, 58], micro_batch_size=2)
    assert got == [[0, 2], [3, 1]]


def test_token_budget_closes_a_micro_batch_before_it_overflows():
    # prompts of 10; completions 2, 3, 20, 21; budget 60 padded positions:
    # [0, 1] -> 2 x (10 + 3) = 26; adding 2 -> 3 x (10 + 20) = 90 > 60: close.
    # [2] -> 30; adding 3 -> 2 x (10 + 21) = 62 > 60: close. [3] alone.
    got = length_micro_batches([0, 1, 2, 3], [10] * 4, [2, 3, 20, 21], 4, token_budget=60)
    assert got == [[0, 1], [2], [3]]


def test_a_sequence_over_the_budget_still_gets_its_own_micro_batch():
    assert length_micro_batches([7, 9], [0] * 7 + [50, 0, 50], [0] * 7 + [50, 0, 5], 8, 20) == [
        [9],
        [7],
    ]


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="micro_batch_size=0"):
        length_micro_batches([0], [1], [1], 0)
    with pytest.raises(ValueError, match="token_budget=0"):
        length_micro_batches([0], [1], [1], 2, token_budget=0)


@given(
    lens=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 80)), min_size=1, max_size=40),
    size=st.integers(1, 9),
    budget=st.one_of(st.none(), st.integers(1, 400)),
)
def test_every_sequence_once_and_every_limit_kept(lens, size, budget):
    prompts = [p for p, _ in lens]
    comps = [c for _, c in lens]
    out = length_micro_batches(list(range(len(lens))), prompts, comps, size, budget)
    assert sorted(i for mb in out for i in mb) == list(range(len(lens)))
    for mb in out:
        assert 1 <= len(mb) <= size
        padded = len(mb) * (max(prompts[i] for i in mb) + max(comps[i] for i in mb))
        assert budget is None or len(mb) == 1 or padded <= budget
    # shortest completions first: micro-batches never interleave in length
    firsts = [comps[mb[0]] for mb in out]
    assert firsts == sorted(firsts)


def test_with_shared_prompts_a_prompts_sequences_stay_together_where_that_is_cheaper():
    # two prompts of 10 tokens (keys 0, 0, 1, 1), completions 1, 9, 2, 10, two per pass.
    # by length: [[0, 2], [1, 3]] = (2 prompts x 10 + 2 x 2) + (2 x 10 + 2 x 10) = 24 + 40 = 64
    # by prompt: [[0, 1], [2, 3]] = (1 x 10 + 2 x 9) + (1 x 10 + 2 x 10) = 28 + 30 = 58: kept
    args = ([0, 1, 2, 3], [10] * 4, [1, 9, 2, 10], 2)
    assert length_micro_batches(*args) == [[0, 2], [1, 3]]
    assert length_micro_batches(*args, prompt_keys=[0, 0, 1, 1]) == [[0, 1], [2, 3]]


def test_with_shared_prompts_sorting_by_length_still_wins_where_it_is_cheaper():
    # prompts of 2 tokens, completions 1, 30, 2, 31: by length (2 x 2 + 2 x 2) + (2 x 2 + 2 x 31)
    # = 74; by prompt (2 + 2 x 30) + (2 + 2 x 31) = 126
    args = ([0, 1, 2, 3], [2] * 4, [1, 30, 2, 31], 2)
    assert length_micro_batches(*args, prompt_keys=[0, 0, 1, 1]) == [[0, 2], [1, 3]]


@given(
    lens=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 80)), min_size=1, max_size=40),
    size=st.integers(1, 9),
    budget=st.one_of(st.none(), st.integers(1, 400)),
    group=st.integers(1, 8),
)
def test_with_shared_prompts_every_sequence_once_and_every_limit_kept(lens, size, budget, group):
    keys = [i // group for i in range(len(lens))]
    prompts = [lens[k * group][0] for k in keys]  # a prompt's sequences share its length
    comps = [c for _, c in lens]
    out = length_micro_batches(list(range(len(lens))), prompts, comps, size, budget, keys)
    assert sorted(i for mb in out for i in mb) == list(range(len(lens)))
    for mb in out:
        assert 1 <= len(mb) <= size
        padded = len(mb) * (max(prompts[i] for i in mb) + max(comps[i] for i in mb))
        assert budget is None or len(mb) == 1 or padded <= budget


@pytest.mark.parametrize(
    "objective, extra",
    [
        ("drgrpo", []),
        ("grpo", []),
        ("gspo", ["algo.clip_low=3e-4", "algo.clip_high=4e-4"]),
        ("cispo", []),
    ],
)
def test_update_does_not_depend_on_how_sequences_are_grouped(
    tiny_model_dir, tmp_path, objective, extra
):
    """One step with every sequence in one pass vs one or two per pass (regrouped by length):
    same rollouts (same seed), and the weights after the update agree to float32 rounding."""
    weights, grad_norms = {}, {}
    for name, micro in {
        "one_pass": ["algo.micro_batch_size=16"],
        "split": [
            "algo.micro_batch_size=2",
            "algo.micro_batch_tokens=30",
        ],
    }.items():
        metrics, weights[name], _ = one_float32_step(
            tiny_model_dir,
            tmp_path / name,
            f"algo.objective={objective}",
            "algo.group_size=4",
            "algo.prompts_per_step=4",
            *extra,
            *micro,
        )
        assert metrics["grad_norm"] > 0  # the rewards varied, so the update moved the weights
        grad_norms[name] = metrics["grad_norm"]
    for k, v in weights["one_pass"].items():
        # Adam's first step moves each weight by ~lr = 1e-2 whatever the gradient's size, so a
        # weight whose gradient is ~0 can differ by rounding; a grouping bug moves it by ~1e-2.
        torch.testing.assert_close(weights["split"][k], v, rtol=0, atol=1e-4, msg=k)
    assert grad_norms["split"] == pytest.approx(grad_norms["one_pass"], rel=1e-5)


def test_listwise_weights_follow_their_group_whatever_the_cut(tiny_model_dir, tmp_path):
    """maxent_listwise with shuffled minibatches: one group per pass or two groups per pass give
    the same update. (A bug applied the weights of the lower-numbered group to whichever group
    came first in a micro-batch, so a pass holding groups [3, 1] trained group 3's candidates
    with group 1's weights.)"""
    weights, metrics = {}, {}
    for name, size in {"one_group": 4, "two_groups": 8}.items():
        metrics[name], weights[name], _ = one_float32_step(
            tiny_model_dir,
            tmp_path / name,
            "algo.objective=maxent_listwise",
            "algo.group_size=4",
            "algo.prompts_per_step=8",
            "algo.minibatches=2",
            f"algo.micro_batch_size={size}",
            "algo.maxent.skip_zero_variance_groups=false",
        )
    assert metrics["one_group"]["reward_std"] > 0  # the listwise weights are not all uniform
    assert metrics["two_groups"]["maxent_listwise_loss"] == pytest.approx(
        metrics["one_group"]["maxent_listwise_loss"], rel=1e-5
    )
    for k, v in weights["one_group"].items():
        torch.testing.assert_close(weights["two_groups"][k], v, rtol=0, atol=1e-4, msg=k)
