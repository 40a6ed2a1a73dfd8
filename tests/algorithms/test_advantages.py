"""Group advantages (grpo, drgrpo, rloo), GAE, whitening and last-token reward placement."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.algorithms import gae_advantages, group_advantages, last_token_rewards, whiten

SQRT3 = math.sqrt(3.0)

# ---------------------------------------------------------------- group advantages, by hand


def test_grpo_uses_unbiased_std():
    # rewards 1, 0, 0, 1: mean 0.5, centred +-0.5,
    # unbiased var = 4 * 0.25 / (4 - 1) = 1/3, std = 1/sqrt(3) -> advantages +-0.5 * sqrt(3).
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), 4, "grpo", eps=0.0)
    h = 0.5 * SQRT3
    torch.testing.assert_close(adv, torch.tensor([[h, -h, -h, h]]))


def test_grpo_eps_is_added_to_std():
    # same group, eps = 0.1: 0.5 / (1/sqrt(3) + 0.1) = 0.5 / 0.6773503 = 0.7381711
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), 4, "grpo", eps=0.1)
    assert adv[0, 0].item() == pytest.approx(0.5 / (1 / SQRT3 + 0.1), rel=1e-6)


def test_drgrpo_only_centres():
    # 3, 1, 2: mean 2 -> 1, -1, 0
    adv = group_advantages(torch.tensor([[3.0, 1.0, 2.0]]), 3, "drgrpo")
    torch.testing.assert_close(adv, torch.tensor([[1.0, -1.0, 0.0]]))


def test_rloo_leave_one_out_baseline():
    # 1, 0, 0, 1: r_0 - mean(0, 0, 1) = 1 - 1/3 = 2/3; r_1 - mean(1, 0, 1) = 0 - 2/3
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), 4, "rloo")
    t = 2.0 / 3.0
    torch.testing.assert_close(adv, torch.tensor([[t, -t, -t, t]]))


def test_groups_are_independent_and_flat_shape_is_kept():
    # group 0 = 3, 1, 2 -> 1, -1, 0; group 1 = 10, 10, 13 -> mean 11 -> -1, -1, 2
    flat = torch.tensor([3.0, 1.0, 2.0, 10.0, 10.0, 13.0])
    adv = group_advantages(flat, 3, "drgrpo")
    assert adv.shape == (6,)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, 0.0, -1.0, -1.0, 2.0]))


def test_integer_rewards_become_float():
    adv = group_advantages(torch.tensor([[1, 0]]), 2, "drgrpo")
    assert adv.dtype == torch.get_default_dtype()
    torch.testing.assert_close(adv, torch.tensor([[0.5, -0.5]]))


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        # valid rewards 1, 0, 1 (the NaN is invalid): mean 2/3, centred 1/3, -2/3, 1/3
        ("drgrpo", [1 / 3, 0.0, -2 / 3, 1 / 3]),
        # unbiased var = (1/9 + 4/9 + 1/9) / 2 = 1/3, std = 1/sqrt(3): centred * sqrt(3)
        ("grpo", [SQRT3 / 3, 0.0, -2 * SQRT3 / 3, SQRT3 / 3]),
        # r_0 = 1 - mean(0, 1) = 0.5; r_2 = 0 - mean(1, 1) = -1; r_3 = 1 - mean(1, 0) = 0.5
        ("rloo", [0.5, 0.0, -1.0, 0.5]),
    ],
)
def test_invalid_samples_are_excluded_and_get_zero(method, expected):
    rewards = torch.tensor([[1.0, float("nan"), 0.0, 1.0]])
    valid = torch.tensor([[True, False, True, True]])
    adv = group_advantages(rewards, 4, method, valid=valid, eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([expected]))
    assert adv[0, 1].item() == 0.0


@pytest.mark.parametrize("method", ["grpo", "drgrpo", "rloo"])
def test_group_with_fewer_than_two_valid_samples_is_zero(method):
    rewards = torch.tensor([[1.0, 0.0, 5.0], [1.0, 0.0, 5.0]])
    valid = torch.tensor([[True, False, False], [False, False, False]])
    adv = group_advantages(rewards, 3, method, valid=valid)
    assert torch.equal(adv, torch.zeros(2, 3))


def test_bad_inputs_name_the_field():
    r = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="known: \\('grpo', 'drgrpo', 'rloo'\\)"):
        group_advantages(r, 4, "ppo")
    with pytest.raises(ValueError, match="group_size=3"):
        group_advantages(r, 3)
    with pytest.raises(ValueError, match="not a multiple of group_size=3"):
        group_advantages(torch.zeros(8), 3)
    with pytest.raises(ValueError, match="non-finite .* positions \\[1\\]"):
        group_advantages(torch.tensor([[0.0, float("nan")]]), 2)
    with pytest.raises(ValueError, match="valid must be a bool"):
        group_advantages(r, 4, valid=torch.ones(2, 4))
    with pytest.raises(ValueError, match="shape mismatch"):
        group_advantages(r, 4, valid=torch.ones(2, 3, dtype=torch.bool))


# ---------------------------------------------------------------- group advantages, properties

# Rewards on a half-integer grid: distinct values stay distinct after a shift/scale (tiny
# float spreads would collapse to a constant group and legitimately change the answer).
groups = st.integers(2, 6).flatmap(
    lambda g: st.lists(
        st.lists(st.integers(-20, 20).map(lambda k: k / 2), min_size=g, max_size=g),
        min_size=1,
        max_size=4,
    )
)


@settings(max_examples=40, deadline=None)
@given(value=st.floats(-100, 100, width=32), p=st.integers(1, 3), g=st.integers(1, 8))
def test_constant_group_has_zero_advantages(value, p, g):
    r = torch.full((p, g), value)
    for method in ("grpo", "drgrpo", "rloo"):
        assert torch.equal(group_advantages(r, g, method), torch.zeros(p, g))


@settings(max_examples=40, deadline=None)
@given(rows=groups)
def test_drgrpo_sums_to_zero_and_rloo_is_rescaled_drgrpo(rows):
    r = torch.tensor(rows, dtype=torch.float64)
    g = r.shape[1]
    dr = group_advantages(r, g, "drgrpo")
    torch.testing.assert_close(dr.sum(-1), torch.zeros(r.shape[0], dtype=torch.float64))
    # r_i - (S - r_i) / (g - 1) = g / (g - 1) * (r_i - S / g)
    torch.testing.assert_close(group_advantages(r, g, "rloo"), dr * g / (g - 1))


@settings(max_examples=40, deadline=None)
@given(rows=groups, shift=st.floats(-50, 50), scale=st.floats(0.5, 20))
def test_grpo_is_shift_and_scale_invariant(rows, shift, scale):
    r = torch.tensor(rows, dtype=torch.float64)
    g = r.shape[1]
    base = group_advantages(r, g, "grpo", eps=0.0)
    moved = group_advantages(r * scale + shift, g, "grpo", eps=0.0)
    torch.testing.assert_close(moved, base, atol=1e-6, rtol=1e-6)
    # every non-constant group ends up with unbiased std 1
    nonconstant = r.amax(-1) > r.amin(-1)
    if nonconstant.any():
        std = base[nonconstant].std(-1)
        torch.testing.assert_close(std, torch.ones_like(std))


# ---------------------------------------------------------------- GAE


def test_gae_by_hand():
    # gamma = lam = 0.5, rewards 0, 0, 1, values 0.5, 0.6, 0.7, value after the end 0:
    # t=2: delta = 1 + 0 - 0.7 = 0.3;               A_2 = 0.3
    # t=1: delta = 0 + 0.5*0.7 - 0.6 = -0.25;        A_1 = -0.25 + 0.25*0.3 = -0.175
    # t=0: delta = 0 + 0.5*0.6 - 0.5 = -0.2;         A_0 = -0.2 + 0.25*(-0.175) = -0.24375
    # returns = A + V = 0.25625, 0.425, 1.0
    # row 2 is right-padded (mask 1, 1, 0), reward 1 on its last valid token, pad value 9:
    # t=1: delta = 1 - 0.6 = 0.4; t=0: delta = 0.5*0.6 - 0.5 = -0.2, A_0 = -0.2 + 0.25*0.4 = -0.1
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [0.5, 0.6, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.5, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[-0.24375, -0.175, 0.3], [-0.1, 0.4, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.25625, 0.425, 1.0], [0.4, 1.0, 0.0]]))


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 6), min_size=1, max_size=4),
    seed=st.integers(0, 10_000),
)
def test_gae_with_gamma_lam_one_is_reward_to_go_minus_value(lengths, seed):
    gen = torch.Generator().manual_seed(seed)
    t_len = 6
    mask = (torch.arange(t_len)[None, :] < torch.tensor(lengths)[:, None]).double()
    rewards = torch.randn(len(lengths), t_len, generator=gen, dtype=torch.float64)
    values = torch.randn(len(lengths), t_len, generator=gen, dtype=torch.float64)
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    to_go = (rewards * mask).flip(-1).cumsum(-1).flip(-1)
    torch.testing.assert_close(adv, (to_go - values) * mask)
    torch.testing.assert_close(ret, to_go * mask)


@settings(max_examples=30, deadline=None)
@given(
    keep=st.lists(st.booleans(), min_size=5, max_size=5),
    gamma=st.floats(0, 1),
    lam=st.floats(0, 1),
    seed=st.integers(0, 10_000),
)
def test_gae_skips_masked_gaps(keep, gamma, lam, seed):
    # A mask with holes gives the same advantages as the sequence with the holes removed.
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(1, 5, generator=gen, dtype=torch.float64)
    values = torch.randn(1, 5, generator=gen, dtype=torch.float64)
    mask = torch.tensor([keep], dtype=torch.float64)
    adv, _ = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
    idx = torch.tensor(keep).nonzero().flatten()
    dense, _ = gae_advantages(
        rewards[:, idx], values[:, idx], torch.ones(1, len(idx), dtype=torch.float64), gamma, lam
    )
    torch.testing.assert_close(adv[:, idx], dense)
    assert torch.all(adv[0, ~torch.tensor(keep)] == 0)


def test_gae_rejects_bad_arguments():
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="gamma"):
        gae_advantages(z, z, torch.ones(2, 3), gamma=1.5, lam=0.9)
    with pytest.raises(ValueError, match="shape mismatch"):
        gae_advantages(z, torch.zeros(2, 4), torch.ones(2, 3), gamma=1.0, lam=1.0)
    with pytest.raises(ValueError, match="mask must contain only 0 and 1"):
        gae_advantages(z, z, torch.full((2, 3), 0.5), gamma=1.0, lam=1.0)


# ---------------------------------------------------------------- whiten, last-token rewards


def test_whiten_by_hand():
    # valid 1, 2, 3: mean 2, population var (1 + 0 + 1) / 3 = 2/3, std 0.8164966
    # -> -1.2247449, 0, 1.2247449; the masked 100 is ignored and set to 0
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    s = math.sqrt(1.5)
    torch.testing.assert_close(whiten(values, mask), torch.tensor([[-s, 0.0, s, 0.0]]))
    # shift_mean=False adds the mean 2 back
    torch.testing.assert_close(
        whiten(values, mask, shift_mean=False), torch.tensor([[2 - s, 2.0, 2 + s, 0.0]])
    )


def test_last_token_rewards():
    # rewards land on the last 1 of each row; an empty row gets nothing
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    out = last_token_rewards(torch.tensor([5.0, 6.0, 7.0]), mask)
    torch.testing.assert_close(out, torch.tensor([[0.0, 5.0, 0.0], [0.0, 0.0, 6.0], [0.0] * 3]))
    with pytest.raises(ValueError, match="seq_rewards has 2 rows but mask has 3"):
        last_token_rewards(torch.zeros(2), mask)
