"""KL estimators, KL controllers and KL as a token-reward penalty."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.algorithms import (
    KL_KINDS,
    AdaptiveKLController,
    FixedKLController,
    kl_estimate,
)

E = math.e


def test_estimators_by_hand():
    # x = logp - ref = 0, 1, -1
    logp = torch.tensor([[0.0, -1.0, -2.0]])
    ref = torch.tensor([[0.0, -2.0, -1.0]])
    torch.testing.assert_close(kl_estimate(logp, ref, "k1"), torch.tensor([[0.0, 1.0, -1.0]]))
    # k2 = x^2 / 2
    torch.testing.assert_close(kl_estimate(logp, ref, "k2"), torch.tensor([[0.0, 0.5, 0.5]]))
    # k3 = exp(-x) + x - 1: 0, 1/e + 1 - 1 = 0.3678794, e - 1 - 1 = 0.7182818
    torch.testing.assert_close(kl_estimate(logp, ref, "k3"), torch.tensor([[0.0, 1 / E, E - 2.0]]))


def test_log_ratio_is_clamped_to_20():
    logp = torch.tensor([1000.0, -1000.0], dtype=torch.float64)
    ref = torch.zeros(2, dtype=torch.float64)
    torch.testing.assert_close(kl_estimate(logp, ref, "k1"), torch.tensor([20.0, -20.0]).double())
    # k3 at x = 20: e^-20 + 19; at x = -20: e^20 - 21 (finite)
    k3 = kl_estimate(logp, ref, "k3")
    expected = torch.tensor([math.exp(-20) + 19.0, math.exp(20) - 21.0], dtype=torch.float64)
    torch.testing.assert_close(k3, expected)


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_unbiased_estimators_average_to_the_exact_kl(kind):
    # Over a 4-token vocabulary, E_{x~p}[k(x)] must equal KL(p || q) exactly
    # (k3: sum_x p (q/p - ln(q/p) - 1) = sum q - 1 + KL = KL).
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    q = torch.tensor([0.25, 0.25, 0.4, 0.1], dtype=torch.float64)
    exact = (p * (p / q).log()).sum()
    expectation = (p * kl_estimate(p.log(), q.log(), kind)).sum()
    torch.testing.assert_close(expectation, exact)


@settings(max_examples=50, deadline=None)
@given(x=st.lists(st.floats(-50, 50), min_size=1, max_size=16))
def test_k3_and_k2_are_non_negative(x):
    logp = torch.tensor(x, dtype=torch.float64)
    ref = torch.zeros_like(logp)
    assert torch.all(kl_estimate(logp, ref, "k3") >= 0)
    assert torch.all(kl_estimate(logp, ref, "k2") >= 0)


def test_unknown_kind_lists_known_ones():
    assert KL_KINDS == ("k1", "k2", "k3")
    with pytest.raises(ValueError, match="known: \\('k1', 'k2', 'k3'\\)"):
        kl_estimate(torch.zeros(2), torch.zeros(2), "k4")


def test_fixed_controller_never_moves():
    ctl = FixedKLController(0.05)
    ctl.update(current_kl=100.0, n_steps=1000)
    assert ctl.value == 0.05


def test_adaptive_controller_by_hand():
    ctl = AdaptiveKLController(init_coef=0.1, target=6.0, horizon=10_000)
    # KL 9 over target 6: error 9/6 - 1 = 0.5, clipped to 0.2; x (1 + 0.2 * 256 / 10000) = 1.00512
    ctl.update(current_kl=9.0, n_steps=256)
    assert ctl.value == pytest.approx(0.1 * 1.00512)
    # KL 5.4 under target: error 5.4/6 - 1 = -0.1; x (1 - 0.1 * 100 / 10000) = 0.999
    ctl.update(current_kl=5.4, n_steps=100)
    assert ctl.value == pytest.approx(0.1 * 1.00512 * 0.999)
    # KL 0: error -1 clipped to -0.2; x (1 - 0.2 * 500 / 10000) = 0.99
    ctl.update(current_kl=0.0, n_steps=500)
    assert ctl.value == pytest.approx(0.1 * 1.00512 * 0.999 * 0.99)
    # at target the coefficient stays
    before = ctl.value
    ctl.update(current_kl=6.0, n_steps=500)
    assert ctl.value == pytest.approx(before)


def test_controllers_reject_bad_arguments():
    with pytest.raises(ValueError, match="coef must be >= 0"):
        FixedKLController(-1.0)
    with pytest.raises(ValueError, match="target must be > 0"):
        AdaptiveKLController(0.1, target=0.0, horizon=10)
    with pytest.raises(ValueError, match="horizon must be > 0"):
        AdaptiveKLController(0.1, target=1.0, horizon=0)


def test_the_config_default_clamp_is_the_algorithms_constant():
    # config is a leaf (no torch), so it repeats the number; this keeps the two from drifting
    from rlvr.algorithms import LOG_RATIO_CLAMP
    from rlvr.config import Config

    assert Config().algo.log_ratio_clamp == LOG_RATIO_CLAMP
