"""Aggregation modes (and micro-batch invariance), clipped policy loss, clipped value loss."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.algorithms import AGG_MODES, aggregate, aggregate_denominator, policy_loss, value_loss

LN = math.log

# ---------------------------------------------------------------- aggregate

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def test_aggregate_modes_by_hand():
    # token_mean: (1 + 2 + 4) / 3 tokens = 7/3
    assert aggregate(VALUES, MASK, "token_mean").item() == pytest.approx(7 / 3)
    # seq_mean_token_mean: mean of (1 + 2) / 2 = 1.5 and 4 / 1 = 4 -> 2.75
    assert aggregate(VALUES, MASK, "seq_mean_token_mean").item() == pytest.approx(2.75)
    # seq_mean_token_sum_norm, max_len 4: mean of 3 / 4 and 4 / 4 -> 0.875
    got = aggregate(VALUES, MASK, "seq_mean_token_sum_norm", max_len=4)
    assert got.item() == pytest.approx(0.875)
    # denominator replaces the count: token sum 7 / 7 = 1; sequence sum 5.5 / 11 = 0.5
    assert aggregate(VALUES, MASK, "token_mean", denominator=7).item() == pytest.approx(1.0)
    assert aggregate(VALUES, MASK, "seq_mean_token_mean", denominator=11).item() == 0.5


def test_aggregate_denominator_counts():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert aggregate_denominator(mask, "token_mean") == 3.0
    # the all-padding row does not count as a sequence
    assert aggregate_denominator(mask, "seq_mean_token_mean") == 2.0
    assert aggregate_denominator(mask, "seq_mean_token_sum_norm") == 2.0


def test_aggregate_ignores_nan_at_masked_positions_in_value_and_grad():
    values = torch.tensor([[1.0, float("nan")], [float("-inf"), 3.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    for mode in AGG_MODES:
        loss = aggregate(values, mask, mode, max_len=2)
        (grad,) = torch.autograd.grad(loss, values)
        assert torch.isfinite(loss)
        assert torch.isfinite(grad).all()
        assert grad[0, 1] == 0 and grad[1, 0] == 0


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregate_of_no_tokens_is_zero_with_zero_grad(mode):
    values = torch.ones(2, 3, requires_grad=True)
    loss = aggregate(values, torch.zeros(2, 3), mode, max_len=3)
    (grad,) = torch.autograd.grad(loss, values)
    assert loss.item() == 0.0
    assert torch.equal(grad, torch.zeros(2, 3))


def test_aggregate_rejects_bad_arguments():
    with pytest.raises(ValueError, match="known: \\('token_mean'"):
        aggregate(VALUES, MASK, "sum")
    with pytest.raises(ValueError, match="max_len is required"):
        aggregate(VALUES, MASK, "seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="max_len=1 but a sequence has 2 valid tokens"):
        aggregate(VALUES, MASK, "seq_mean_token_sum_norm", max_len=1)
    with pytest.raises(ValueError, match="denominator must be > 0"):
        aggregate(VALUES, MASK, "token_mean", denominator=0)
    with pytest.raises(ValueError, match="shape mismatch"):
        aggregate(VALUES, MASK[:, :2], "token_mean")


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("micro", [1, 2, 3])
def test_micro_batches_give_the_full_batch_loss_and_gradient(mode, micro):
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 1, 3, 0, 4, 2])  # includes an all-padding row
    mask = (torch.arange(5)[None, :] < lengths[:, None]).double()
    values = torch.randn(6, 5, generator=gen, dtype=torch.float64, requires_grad=True)

    full = aggregate(values, mask, mode, max_len=8)
    (full_grad,) = torch.autograd.grad(full, values)

    denom = aggregate_denominator(mask, mode)
    total = values.new_zeros(())
    for start in range(0, 6, micro):
        rows = slice(start, start + micro)
        # each micro-batch is cut to its own longest row, as a token-budget batcher pads it
        width = max(int(lengths[rows].max()), 1)
        total = total + aggregate(
            values[rows, :width], mask[rows, :width], mode, max_len=8, denominator=denom
        )
    (split_grad,) = torch.autograd.grad(total, values)
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(split_grad, full_grad)


# ---------------------------------------------------------------- policy loss, by hand

# Four tokens with ratios 1, 1.5, 0.5, 1.1 (log-ratios ln of those), clip 0.2 / 0.2.
RATIOS = torch.tensor([1.0, 1.5, 0.5, 1.1], dtype=torch.float64)


def _tokens(ratios=RATIOS):
    old = torch.zeros(1, len(ratios), dtype=torch.float64)
    logp = torch.log(ratios)[None, :].clone().requires_grad_(True)
    return logp, old, torch.ones_like(old)


def test_policy_loss_positive_advantage_by_hand():
    logp, old, mask = _tokens()
    loss, stats = policy_loss(logp, old, torch.tensor([1.0]), mask, agg_mode="token_mean")
    # A = +1: per token -min(r, clip(r, 0.8, 1.2)) = -1, -1.2 (clipped high), -0.5, -1.1
    # token mean = -(1 + 1.2 + 0.5 + 1.1) / 4 = -0.95
    assert loss.item() == pytest.approx(-0.95)
    # d/dlogp of -r/4 is -r/4 where unclipped, 0 where the high clip binds
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(grad, torch.tensor([[-0.25, 0.0, -0.125, -0.275]]).double())
    assert stats["clip_frac_high"] == pytest.approx(0.25)
    assert stats["clip_frac_low"] == 0.0
    # ratio mean (1 + 1.5 + 0.5 + 1.1) / 4 = 1.025
    assert stats["ratio_mean"] == pytest.approx(1.025)
    assert (stats["ratio_min"], stats["ratio_max"]) == pytest.approx((0.5, 1.5))
    # k3 = r - 1 - ln r: 0, 0.5 - 0.4054651, -0.5 + 0.6931472, 0.1 - 0.0953102; mean 0.0730930
    expected_kl = (0.5 - LN(1.5) + (-0.5 - LN(0.5)) + (0.1 - LN(1.1))) / 4
    assert stats["approx_kl"] == pytest.approx(expected_kl)
    assert stats["log_ratio_max"] == pytest.approx(LN(1.5))
    assert stats["log_ratio_min"] == pytest.approx(LN(0.5))
    assert stats["log_ratio_clamped_max"] == pytest.approx(LN(1.5))
    assert stats["tokens"] == 4.0


def test_policy_loss_negative_advantage_by_hand():
    logp, old, mask = _tokens()
    loss, stats = policy_loss(logp, old, torch.tensor([-1.0]), mask, agg_mode="token_mean")
    # A = -1: per token max(r, clip(r)) = 1, 1.5, 0.8 (clipped low), 1.1 -> mean 4.4 / 4 = 1.1
    assert loss.item() == pytest.approx(1.1)
    # gradient r/4 where unclipped, 0 on the low-clipped token
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(grad, torch.tensor([[0.25, 0.375, 0.0, 0.275]]).double())
    assert stats["clip_frac_low"] == pytest.approx(0.25)
    assert stats["clip_frac_high"] == 0.0


def test_clip_higher_uses_separate_bounds():
    # ratios 1.25 and 1.3 with A = +1, clip_high 0.28: 1.25 < 1.28 keeps its gradient -1.25/2,
    # 1.3 > 1.28 is clipped to 1.28 with zero gradient; loss = -(1.25 + 1.28) / 2 = -1.265
    logp, old, mask = _tokens(torch.tensor([1.25, 1.3], dtype=torch.float64))
    loss, stats = policy_loss(
        logp, old, torch.tensor([1.0]), mask, clip_low=0.2, clip_high=0.28, agg_mode="token_mean"
    )
    assert loss.item() == pytest.approx(-1.265)
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(grad, torch.tensor([[-0.625, 0.0]]).double())
    assert stats["clip_frac_high"] == pytest.approx(0.5)


def test_dual_clip_bounds_negative_advantage_loss():
    # ratio e^2 = 7.389 with A = -1: plain PPO loss max(7.389, 1.2) = 7.389 with gradient 7.389;
    # dual clip c = 3 caps it at -A * c = 3 with zero gradient.
    logp, old, mask = _tokens(torch.tensor([math.exp(2.0)], dtype=torch.float64))
    plain, _ = policy_loss(logp, old, torch.tensor([-1.0]), mask, agg_mode="token_mean")
    assert plain.item() == pytest.approx(math.exp(2.0))
    (g_plain,) = torch.autograd.grad(plain, logp)
    assert g_plain.item() == pytest.approx(math.exp(2.0))

    dual, stats = policy_loss(
        logp, old, torch.tensor([-1.0]), mask, dual_clip=3.0, agg_mode="token_mean"
    )
    assert dual.item() == pytest.approx(3.0)
    (g_dual,) = torch.autograd.grad(dual, logp)
    assert g_dual.item() == 0.0
    assert stats["dual_clip_frac"] == 1.0
    # a positive advantage is untouched by the dual clip: -min(7.389, 1.2) = -1.2
    pos, _ = policy_loss(logp, old, torch.tensor([1.0]), mask, dual_clip=3.0, agg_mode="token_mean")
    assert pos.item() == pytest.approx(-1.2)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_log_ratio_of_1000_keeps_loss_and_grad_finite(sign):
    logp = torch.tensor([[1000.0, 0.0]], requires_grad=True)
    old = torch.zeros(1, 2)
    loss, stats = policy_loss(
        logp, old, torch.tensor([sign]), torch.ones(1, 2), agg_mode="token_mean"
    )
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    if sign < 0:
        # the clamped ratio is e^20: loss (e^20 + 1) / 2, no gradient through the clamp
        assert loss.item() == pytest.approx((math.exp(20.0) + 1) / 2, rel=1e-5)
        assert grad[0, 0].item() == 0.0
    assert stats["log_ratio_max"] == 1000.0
    assert stats["log_ratio_clamped_max"] == 20.0


def test_masked_nan_log_probs_do_not_leak():
    logp = torch.tensor([[-1.0, float("-inf")]], requires_grad=True)
    old = torch.tensor([[-1.0, float("-inf")]])
    mask = torch.tensor([[1.0, 0.0]])
    loss, stats = policy_loss(logp, old, torch.tensor([1.0]), mask, agg_mode="token_mean")
    (grad,) = torch.autograd.grad(loss, logp)
    # one valid token with ratio 1: loss -1, gradient -1 on it and 0 on the padding
    assert loss.item() == pytest.approx(-1.0)
    torch.testing.assert_close(grad, torch.tensor([[-1.0, 0.0]]))
    assert stats["tokens"] == 1.0


def test_log_ratio_p99_over_valid_tokens_only():
    # |log-ratio| = 0, 1, ..., 100 on 101 valid tokens: the 0.99 quantile (linear
    # interpolation at index 0.99 * 100 = 99) is 99; a masked token at 5000 is ignored.
    lr = torch.cat([-torch.arange(101.0), torch.tensor([5000.0])])[None, :]
    mask = torch.ones_like(lr)
    mask[0, -1] = 0
    _, stats = policy_loss(
        lr, torch.zeros_like(lr), torch.ones(1), mask, agg_mode="token_mean", log_ratio_clamp=200
    )
    assert stats["log_ratio_abs_p99"] == pytest.approx(99.0)
    assert stats["log_ratio_min"] == -100.0
    assert stats["log_ratio_max"] == 0.0


def test_is_weights_scale_tokens_without_gradient():
    # ratios 1, 1 with A = +1 and weights 0.5, 2: loss -(0.5 + 2) / 2 = -1.25
    logp, old, mask = _tokens(torch.tensor([1.0, 1.0], dtype=torch.float64))
    w = torch.tensor([[0.5, 2.0]], dtype=torch.float64, requires_grad=True)
    loss, _ = policy_loss(logp, old, torch.tensor([1.0]), mask, is_weights=w, agg_mode="token_mean")
    assert loss.item() == pytest.approx(-1.25)
    loss.backward()
    assert w.grad is None
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.25, -1.0]]).double())


def test_dr_grpo_default_aggregation_and_token_advantages():
    # default agg seq_mean_token_sum_norm, max_len 4: ratios 1 and A = 2 on 2 tokens of row 0,
    # A = -1 on 1 token of row 1: (-(2 + 2) / 4 + 1 / 4) / 2 = -0.375
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    seq_adv = torch.tensor([2.0, -1.0])
    loss, _ = policy_loss(logp, torch.zeros(2, 3), seq_adv, mask, max_len=4)
    assert loss.item() == pytest.approx(-0.375)
    tok_adv = seq_adv[:, None].expand(2, 3).clone()
    loss_tok, _ = policy_loss(logp, torch.zeros(2, 3), tok_adv, mask, max_len=4)
    assert loss_tok.item() == loss.item()


def test_policy_loss_rejects_bad_arguments():
    z = torch.zeros(2, 3)
    m = torch.ones(2, 3)
    with pytest.raises(ValueError, match="advantages must be \\[N\\]"):
        policy_loss(z, z, torch.zeros(3), m, max_len=3)
    with pytest.raises(ValueError, match="dual_clip must be None or > 1"):
        policy_loss(z, z, torch.zeros(2), m, dual_clip=1.0, max_len=3)
    with pytest.raises(ValueError, match="clip_low must be in \\[0, 1\\)"):
        policy_loss(z, z, torch.zeros(2), m, clip_low=1.0, max_len=3)
    with pytest.raises(ValueError, match="max_len is required"):
        policy_loss(z, z, torch.zeros(2), m)


# ---------------------------------------------------------------- policy loss, properties


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    clip_low=st.floats(0.0, 0.5),
    clip_high=st.floats(0.0, 1.0),
    scale=st.floats(0.01, 3.0),
)
def test_stats_are_in_range_and_clipped_tokens_get_no_gradient(seed, clip_low, clip_high, scale):
    gen = torch.Generator().manual_seed(seed)
    old = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    delta = scale * torch.randn(3, 6, generator=gen, dtype=torch.float64)
    logp = (old + delta).requires_grad_(True)
    adv = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    mask = (torch.rand(3, 6, generator=gen) < 0.7).double()
    loss, stats = policy_loss(
        logp, old, adv, mask, clip_low=clip_low, clip_high=clip_high, agg_mode="token_mean"
    )
    (grad,) = torch.autograd.grad(loss, logp)
    for key in ("clip_frac_low", "clip_frac_high"):
        assert 0.0 <= stats[key] <= 1.0
    assert stats["clip_frac_low"] + stats["clip_frac_high"] <= 1.0 + 1e-12
    assert stats["approx_kl"] >= 0.0
    if stats["tokens"] > 0:
        assert stats["ratio_min"] <= stats["ratio_mean"] <= stats["ratio_max"]
        # tail stats agree with torch's own quantile / max over the valid raw log-ratios
        raw = (logp.detach() - old)[mask > 0]
        assert stats["log_ratio_abs_p99"] == pytest.approx(torch.quantile(raw.abs(), 0.99).item())
        assert stats["log_ratio_max"] == pytest.approx(raw.max().item())
    ratio = (logp.detach() - old).exp()
    binds = ((adv > 0) & (ratio > 1 + clip_high)) | ((adv < 0) & (ratio < 1 - clip_low))
    free = (mask > 0) & ~binds & (adv != 0)
    assert torch.all(grad[binds | (mask == 0)] == 0)
    # where no clip binds, the gradient is the unclipped one: -A * ratio / tokens
    n = mask.sum().clamp(min=1)
    torch.testing.assert_close(grad[free], (-adv * ratio / n)[free])


# ---------------------------------------------------------------- value loss


def test_value_loss_by_hand():
    values = torch.tensor([[0.5, 1.0, 2.0]], requires_grad=True)
    old = torch.tensor([[0.4, 0.4, 2.0]])
    returns = torch.tensor([[1.0, 2.0, 1.0]])
    mask = torch.ones(1, 3)
    loss, stats = value_loss(values, old, returns, mask, clip=0.2)
    # t0: change 0.1 within clip, 0.5 * (0.5 - 1)^2 = 0.125
    # t1: change 0.6 clipped to 0.2 -> V_clip = 0.6; errors (1 - 2)^2 = 1, (0.6 - 2)^2 = 1.96;
    #     the clipped one is larger -> 0.5 * 1.96 = 0.98, no gradient
    # t2: 0.5 * (2 - 1)^2 = 0.5;  token mean (0.125 + 0.98 + 0.5) / 3 = 0.535
    assert loss.item() == pytest.approx(0.535)
    (grad,) = torch.autograd.grad(loss, values)
    # d/dV 0.5 (V - R)^2 / 3 = (V - R) / 3: -0.5/3, 0 (clipped), 1/3
    torch.testing.assert_close(grad, torch.tensor([[-1 / 6, 0.0, 1 / 3]]))
    assert stats["value_clip_frac"] == pytest.approx(1 / 3)
    assert stats["value_mean"] == pytest.approx(3.5 / 3)
    assert stats["return_mean"] == pytest.approx(4 / 3)
    # no clipping: 0.5 * (0.25 + 1 + 1) / 3 = 0.375
    plain, plain_stats = value_loss(values, old, returns, mask, clip=None)
    assert plain.item() == pytest.approx(0.375)
    assert plain_stats["value_clip_frac"] == 0.0


def test_ratio_stats_by_hand_and_equal_to_policy_loss_stats():
    from rlvr.algorithms import ratio_stats

    # one sequence, two tokens: log-ratios ln 2 and 0, advantage +1
    old = torch.zeros(1, 2)
    logp = torch.tensor([[math.log(2.0), 0.0]])
    mask = torch.ones(1, 2)
    adv = torch.tensor([1.0])
    st = ratio_stats(logp, old, adv, mask)
    assert st["ratio_max"] == pytest.approx(2.0)
    assert st["ratio_mean"] == pytest.approx(1.5)  # (2 + 1) / 2
    assert st["clip_frac_high"] == pytest.approx(0.5)  # ratio 2 > 1.2 with A > 0: 1 token of 2
    assert st["clip_frac_low"] == 0.0
    # approx_kl = mean(ratio - 1 - log ratio) = ((2 - 1 - ln 2) + 0) / 2 = 0.153426
    assert st["approx_kl"] == pytest.approx((1 - math.log(2.0)) / 2, abs=1e-6)
    _, from_loss = policy_loss(logp, old, adv, mask, agg_mode="token_mean")
    assert {k: from_loss[k] for k in st} == pytest.approx(st)
