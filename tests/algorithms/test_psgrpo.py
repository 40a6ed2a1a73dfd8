"""PS-GRPO per-step advantages ("variant 2"): A_t = r_{s,t} GN(mean step score) + GN(outcome)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.algorithms import group_advantages, psgrpo_step_advantages

H = 1 / math.sqrt(2)  # GroupNorm of any two distinct values with the unbiased std: +-1/sqrt(2)


def test_two_responses_by_hand():
    # step means: (0.9 + 0.7) / 2 = 0.8 and 0.2 -> mean 0.5, centred +-0.3,
    # unbiased var = (0.09 + 0.09) / 1 = 0.18, std 0.4242641 -> GN = +-0.7071068 = +-H
    # outcome 1, 0 -> GN = +-H as well
    # row 0 (steps 0, 0, 1, after-last, pad): 0.9 H + H, 0.9 H + H, 0.7 H + H, H, 0
    # row 1 (steps 0, 0, after-last, pad, pad): -0.2 H - H, -0.2 H - H, -H, 0, 0
    ids = torch.tensor([[0, 0, 1, -1, -1], [0, 0, -1, -1, -1]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    adv = psgrpo_step_advantages(
        [[0.9, 0.7], [0.2]], torch.tensor([[1.0, 0.0]]), ids, mask, group_size=2, eps=0.0
    )
    expected = torch.tensor(
        [
            [1.9 * H, 1.9 * H, 1.7 * H, H, 0.0],
            [-1.2 * H, -1.2 * H, -H, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(adv, expected)


def test_step_term_is_signed_by_the_group_comparison():
    # Same outcome for both (GN(outcome) = 0): only the step term remains. Response 1 has the
    # lower step mean (0.6 vs 0.8), so its steps are pushed down although every score is
    # positive: GN = -H, tokens -0.6 H. Response 0: +0.8 H.
    ids = torch.tensor([[0], [0]])
    mask = torch.ones(2, 1)
    adv = psgrpo_step_advantages(
        [[0.8], [0.6]], torch.tensor([1.0, 1.0]), ids, mask, group_size=2, eps=0.0
    )
    torch.testing.assert_close(adv, torch.tensor([[0.8 * H], [-0.6 * H]]))


def test_response_without_steps_is_left_out_of_step_statistics():
    # scores (1.0), (0.0), (none): step GN over the first two only = +-H; the third has no
    # step term. outcome 1, 0, 0: mean 1/3, centred 2/3, -1/3, -1/3,
    # unbiased var = (4/9 + 1/9 + 1/9) / 2 = 1/3, std 1/sqrt(3) -> 2/sqrt(3), -1/sqrt(3), -1/sqrt(3)
    s3 = math.sqrt(3)
    ids = torch.tensor([[0, -1], [0, -1], [-1, -1]])
    mask = torch.ones(3, 2)
    adv = psgrpo_step_advantages(
        [[1.0], [0.0], []], torch.tensor([[1.0, 0.0, 0.0]]), ids, mask, group_size=3, eps=0.0
    )
    expected = torch.tensor([[H + 2 / s3, 2 / s3], [0.0 - 1 / s3, -1 / s3], [-1 / s3, -1 / s3]])
    torch.testing.assert_close(adv, expected)


def test_invalid_response_gets_zero_and_is_excluded():
    # response 2 is invalid: outcome GN over (1, 0) = +-H, step GN over means (0.5, 0.1) = +-H
    ids = torch.tensor([[0], [0], [0]])
    adv = psgrpo_step_advantages(
        [[0.5], [0.1], [0.9]],
        torch.tensor([[1.0, 0.0, 1.0]]),
        ids,
        torch.ones(3, 1),
        group_size=3,
        eps=0.0,
        valid=torch.tensor([[True, True, False]]),
    )
    torch.testing.assert_close(adv, torch.tensor([[0.5 * H + H], [-0.1 * H - H], [0.0]]))


@settings(max_examples=30, deadline=None)
@given(
    g=st.integers(2, 5),
    score=st.floats(0.0, 1.0),
    n_steps=st.integers(1, 3),
    seed=st.integers(0, 1000),
)
def test_equal_step_means_leave_only_the_outcome_term(g, score, n_steps, seed):
    gen = torch.Generator().manual_seed(seed)
    outcome = torch.randint(0, 2, (1, g), generator=gen).double()
    t_len = 6
    ids = torch.randint(-1, n_steps, (g, t_len), generator=gen)
    mask = torch.ones(g, t_len)
    adv = psgrpo_step_advantages([[score] * n_steps] * g, outcome, ids, mask, group_size=g)
    expected = group_advantages(outcome, g, "grpo").reshape(g, 1).expand(g, t_len)
    torch.testing.assert_close(adv, expected)


def test_bad_inputs_are_named():
    ids = torch.tensor([[0, 1], [0, -1]])
    mask = torch.ones(2, 2)
    outcome = torch.tensor([[1.0, 0.0]])
    with pytest.raises(ValueError, match="row 0 refers to a step beyond its 1 step_scores"):
        psgrpo_step_advantages([[0.5], [0.5]], outcome, ids, mask, group_size=2)
    with pytest.raises(ValueError, match="len\\(step_scores\\)=3"):
        psgrpo_step_advantages([[0.5]] * 3, outcome, ids, mask, group_size=2)
    with pytest.raises(ValueError, match="step_token_ids must be >= -1"):
        psgrpo_step_advantages(
            [[0.5], [0.5]], outcome, torch.tensor([[0, -2], [0, 0]]), mask, group_size=2
        )
    with pytest.raises(ValueError, match="step_scores must be finite"):
        psgrpo_step_advantages([[float("nan")], [0.5]], outcome, ids * 0, mask, group_size=2)


def test_dense_step_advantages_by_hand():
    from rlvr.algorithms import dense_step_advantages

    # one group of 3. Reply A: 3 tokens, steps [0, 0, 1] scored 0.5 and 0.8, outcome 1:
    #   rewards [0, 0.5, 0.8 + 1] -> returns-to-go [2.3, 2.3, 1.8].
    # Reply B: 2 tokens, one step scored 0.2, outcome 0: rewards [0, 0.2] -> returns [0.2, 0.2].
    # Reply C: invalid (its reward failed): advantage 0, left out of the baseline.
    # Baseline: mean total return of A and B = (2.3 + 0.2) / 2 = 1.25.
    ids = torch.tensor([[0, 0, 1], [0, 0, -1], [0, 0, 0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = dense_step_advantages(
        [[0.5, 0.8], [0.2], [0.9]],
        torch.tensor([[1.0, 0.0, 1.0]]),
        ids,
        mask,
        3,
        valid=torch.tensor([[True, True, False]]),
    )
    expected = torch.tensor([[1.05, 1.05, 0.55], [-1.05, -1.05, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, expected)
