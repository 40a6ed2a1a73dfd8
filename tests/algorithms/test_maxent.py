"""MaxEnt-GRPO listwise weights, active groups, listwise loss, clip term, sequence log-probs."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.algorithms import (
    active_groups,
    maxent_clip_term,
    maxent_listwise_loss,
    maxent_weights,
    sequence_logp,
)


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# ---------------------------------------------------------------- weights


def test_weights_by_hand_beta_zero():
    # q = softmax(1, 0) = (sigmoid(1), sigmoid(-1)); w = softmax(log q / 0.5) = q^2 / sum q^2,
    # whose odds are (e^1)^2 = e^2, so w = (sigmoid(2), sigmoid(-2)) = (0.8807971, 0.1192029).
    q, w = maxent_weights(torch.tensor([[1.0, 0.0]]), None, 0.5, 0.0, 1.0, 0.0)
    torch.testing.assert_close(q, torch.tensor([[sigmoid(1), sigmoid(-1)]]))
    torch.testing.assert_close(w, torch.tensor([[sigmoid(2), sigmoid(-2)]]))


def test_q_floor_by_hand():
    # K = 2, q_eps = 0.1: q <- q * (1 - 0.2) + 0.1 = 0.7310586 * 0.8 + 0.1 = 0.6848469, 0.3151531
    q, _ = maxent_weights(torch.tensor([[1.0, 0.0]]), None, 0.5, 0.0, 1.0, 0.1)
    torch.testing.assert_close(q, torch.tensor([[sigmoid(1) * 0.8 + 0.1, sigmoid(-1) * 0.8 + 0.1]]))


def test_weights_by_hand_with_reference():
    # tau = beta = 0.5, q_eps = 0: logits (log q + 0.5 ref) / 1. The log-odds of candidate 0
    # over 1 are (log q0 - log q1) + 0.5 (ref0 - ref1) = 1 + 0.5 * (-1 + 2) = 1.5.
    _, w = maxent_weights(
        torch.tensor([[1.0, 0.0]]), torch.tensor([[-1.0, -2.0]]), 0.5, 0.5, 1.0, 0
    )
    torch.testing.assert_close(w, torch.tensor([[sigmoid(1.5), sigmoid(-1.5)]]))


def test_q_temperature_by_hand():
    # q_temperature 2 halves the reward gap: q = (sigmoid(0.5), sigmoid(-0.5));
    # tau 1, beta 0 -> w = q
    q, w = maxent_weights(torch.tensor([[1.0, 0.0]]), None, 1.0, 0.0, 2.0, 0.0)
    torch.testing.assert_close(q, torch.tensor([[sigmoid(0.5), sigmoid(-0.5)]]))
    torch.testing.assert_close(w, q)


rewards_st = st.integers(2, 6).flatmap(
    lambda k: st.lists(
        st.lists(st.floats(-5, 5, allow_nan=False), min_size=k, max_size=k),
        min_size=1,
        max_size=3,
    )
)


@settings(max_examples=40, deadline=None)
@given(
    rows=rewards_st,
    tau=st.floats(0.05, 3.0),
    beta=st.floats(0.0, 2.0),
    q_temperature=st.floats(0.1, 5.0),
    q_eps=st.floats(0.0, 0.1),
    seed=st.integers(0, 1000),
)
def test_weights_are_distributions_matching_the_closed_form(
    rows, tau, beta, q_temperature, q_eps, seed
):
    r = torch.tensor(rows, dtype=torch.float64)
    k = r.shape[1]
    q_eps = min(q_eps, 1.0 / k)
    ref = -3.0 * torch.rand(r.shape, generator=torch.Generator().manual_seed(seed)).double()
    q, w = maxent_weights(r, ref, tau, beta, q_temperature, q_eps)
    ones = torch.ones(r.shape[0], dtype=torch.float64)
    torch.testing.assert_close(q.sum(-1), ones)
    torch.testing.assert_close(w.sum(-1), ones)
    assert torch.all(q >= q_eps * (1 - 1e-12))
    # pi* ∝ q^(1/(tau+beta)) * pi_ref^(beta/(tau+beta)), computed through powers of
    # probabilities (a different route from the implementation's log-space softmax)
    ref_prob = ref.exp()
    unnorm = q ** (1.0 / (tau + beta)) * ref_prob ** (beta / (tau + beta))
    torch.testing.assert_close(w, unnorm / unnorm.sum(-1, keepdim=True))


@settings(max_examples=30, deadline=None)
@given(rows=rewards_st, tau=st.floats(0.05, 3.0), q_eps=st.floats(0.0, 0.1))
def test_beta_zero_reduces_to_softmax_of_log_q_over_tau(rows, tau, q_eps):
    r = torch.tensor(rows, dtype=torch.float64)
    q_eps = min(q_eps, 1.0 / r.shape[1])
    # the reference is ignored at beta = 0, even if it is garbage
    garbage = torch.full_like(r, float("nan"))
    q, w = maxent_weights(r, garbage, tau, 0.0, 1.0, q_eps)
    torch.testing.assert_close(w, torch.softmax(q.log() / tau, -1))
    # a higher-reward candidate never gets less weight
    order = r.argsort(-1)
    assert torch.all(w.gather(-1, order).diff(dim=-1) >= -1e-12)


def test_weights_carry_no_gradient():
    r = torch.tensor([[1.0, 0.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    q, w = maxent_weights(r, ref, 0.5, 0.5, 1.0, 1e-6)
    assert not q.requires_grad and not w.requires_grad


def test_weights_reject_bad_arguments():
    r = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="tau must be > 0"):
        maxent_weights(r, None, 0.0, 0.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="beta must be >= 0"):
        maxent_weights(r, None, 0.5, -1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="q_temperature must be > 0"):
        maxent_weights(r, None, 0.5, 0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="K \\* q_eps"):
        maxent_weights(r, None, 0.5, 0.0, 1.0, 0.5)
    with pytest.raises(ValueError, match="ref_seq_logp is required when beta > 0"):
        maxent_weights(r, None, 0.5, 0.1, 1.0, 0.0)
    with pytest.raises(ValueError, match="K >= 2"):
        maxent_weights(torch.zeros(2, 1), None, 0.5, 0.0, 1.0, 0.0)


# ---------------------------------------------------------------- active groups, losses


def test_active_groups():
    # float64: 0.5 + 1e-9 is not representable in float32
    r = torch.tensor(
        [[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.5, 0.5 + 1e-9, 0.5]], dtype=torch.float64
    )
    assert active_groups(r).tolist() == [False, True, False]
    assert active_groups(r, tol=1e-10).tolist() == [False, True, True]


def test_listwise_loss_by_hand():
    # group 0: s = (0, 0) -> log_softmax = (-ln 2, -ln 2); loss = ln 2 = 0.6931472
    # group 1: s = (ln 3, 0) -> softmax (0.75, 0.25); w = (0.5, 0.5):
    #          loss = -(0.5 ln 0.75 + 0.5 ln 0.25) = 0.8369882
    # group 2 is inactive (and holds a NaN that must not leak); mean of two = 0.7650677
    s = torch.tensor([[0.0, 0.0], [math.log(3), 0.0], [float("nan"), 0.0]], requires_grad=True)
    w = torch.tensor([[0.75, 0.25], [0.5, 0.5], [0.5, 0.5]])
    active = torch.tensor([True, True, False])
    loss = maxent_listwise_loss(s, w, active)
    g1 = -(0.5 * math.log(0.75) + 0.5 * math.log(0.25))
    assert loss.item() == pytest.approx((math.log(2) + g1) / 2)
    (grad,) = torch.autograd.grad(loss, s)
    # d/ds_i = -(w_i - softmax_i) / 2 groups: group 0 -(0.75-0.5)/2 = -0.125, +0.125;
    # group 1 -(0.5-0.75)/2 = 0.125, -0.125; group 2 nothing
    expected = torch.tensor([[-0.125, 0.125], [0.125, -0.125], [0.0, 0.0]])
    torch.testing.assert_close(grad, expected)


def test_losses_with_no_active_group_are_zero_not_nan():
    s = torch.tensor([[float("nan"), 0.0], [1.0, 2.0]], requires_grad=True)
    w = torch.full((2, 2), 0.5)
    none = torch.tensor([False, False])
    for loss in (
        maxent_listwise_loss(s, w, none),
        maxent_clip_term(s, torch.zeros(2, 2), w, none),
    ):
        (grad,) = torch.autograd.grad(loss, s)
        assert loss.item() == 0.0
        assert torch.equal(grad, torch.zeros(2, 2))


def test_clip_term_by_hand():
    # w = (0.8, 0.2), K = 2 -> a = (0.3, -0.3); ratios exp(s - s_old) = (1.5, 0.9), clip 0.2:
    # candidate 0: min(1.5 * 0.3, 1.2 * 0.3) = 0.36 (clipped, no gradient)
    # candidate 1: min(0.9 * -0.3, 0.9 * -0.3) = -0.27 (inside the range)
    # loss = -(0.36 - 0.27) = -0.09; d/ds_1 = -(a_1 * ratio_1) = 0.27
    s_old = torch.tensor([[-2.0, -3.0]], dtype=torch.float64)
    s = (s_old + torch.log(torch.tensor([[1.5, 0.9]], dtype=torch.float64))).requires_grad_(True)
    w = torch.tensor([[0.8, 0.2]], dtype=torch.float64)
    loss = maxent_clip_term(s, s_old, w, torch.tensor([True]), clip_low=0.2, clip_high=0.2)
    assert loss.item() == pytest.approx(-0.09)
    (grad,) = torch.autograd.grad(loss, s)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.27]], dtype=torch.float64))


@settings(max_examples=30, deadline=None)
@given(k=st.integers(2, 6), seed=st.integers(0, 1000))
def test_clip_term_matches_listwise_gradient_at_uniform_policy_and_ratio_one(k, seed):
    gen = torch.Generator().manual_seed(seed)
    w = torch.softmax(torch.randn(1, k, generator=gen, dtype=torch.float64), -1)
    s = torch.full((1, k), -4.0, dtype=torch.float64, requires_grad=True)  # uniform softmax
    active = torch.tensor([True])
    (g_list,) = torch.autograd.grad(maxent_listwise_loss(s, w, active), s)
    (g_clip,) = torch.autograd.grad(maxent_clip_term(s, s.detach(), w, active), s)
    torch.testing.assert_close(g_clip, g_list)
    torch.testing.assert_close(g_list, -(w - 1.0 / k))


def test_group_inputs_are_shape_checked():
    with pytest.raises(ValueError, match="active must have shape \\[2\\]"):
        maxent_listwise_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="shape mismatch"):
        maxent_listwise_loss(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, dtype=torch.bool))


def test_sequence_logp():
    # row 0: -1 + -2 = -3, mean -1.5 (NaN in padding ignored); row 1 empty: 0 either way
    tok = torch.tensor([[-1.0, -2.0, float("nan")], [0.5, 0.5, 0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(sequence_logp(tok, mask, False), torch.tensor([-3.0, 0.0]))
    torch.testing.assert_close(sequence_logp(tok, mask, True), torch.tensor([-1.5, 0.0]))
