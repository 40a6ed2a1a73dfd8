import math

import pytest
import torch

from rlvr.algorithms.sequence_losses import overlong_penalty, truncated_is_weights


def test_overlong_penalty_hand_values():
    # max_len=10, buffer=4: free up to 6; 8 -> -(2/4) = -0.5 * factor 2 = -1.0; 10 and 12 -> -2
    out = overlong_penalty(torch.tensor([5, 6, 8, 10, 12]), 10, 4, factor=2.0)
    assert out.tolist() == [0.0, 0.0, -1.0, -2.0, -2.0]


def test_truncated_is_weights_hand_values():
    # exp(0)=1; exp(ln 3)=3 capped at 2; exp(-ln 2)=0.5
    w = truncated_is_weights(torch.tensor([0.0, math.log(3), -math.log(2)]), torch.zeros(3), 2.0)
    assert torch.allclose(w, torch.tensor([1.0, 2.0, 0.5]))


def test_gspo_loss_hand_values():
    from rlvr.algorithms.sequence_losses import gspo_loss

    # seq 0: log-ratios [ln2, ln2] -> s=2, A=1: min(2, clip 1.2) = 1.2
    # seq 1: log-ratio [0] (second token padding) -> s=1, A=-1: -1
    # loss = -(1.2 - 1) / 2 = -0.1; clipped fraction 1/2
    ln2 = math.log(2)
    logp = torch.tensor([[ln2, ln2], [0.0, float("nan")]])
    loss, st = gspo_loss(
        logp, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), torch.tensor([[1, 1], [1, 0]]), 0.2, 0.2
    )
    assert abs(float(loss.detach()) + 0.1) < 1e-6
    assert st["seq_clip_frac"] == 0.5 and abs(st["seq_ratio_max"] - 2.0) < 1e-6


def test_gspo_loss_gradient_by_hand():
    from rlvr.algorithms.sequence_losses import gspo_loss

    # seq 0: log-ratios [ln2, ln2], s = 2, A = 1; seq 1: [0] (+ padding), s = 1, A = -1.
    # clip 0.2/2.0: both inside [0.8, 3]: loss = -(2 * 1 + 1 * -1) / 2 = -0.5.
    # d s_i / d logp_t = s_i / n_i, so d loss / d logp = -A_i s_i / (n_i * 2):
    # seq 0: -1 * 2 / (2 * 2) = -0.5 per token; seq 1: +1 * 1 / (1 * 2) = 0.5; padding 0.
    ln2 = math.log(2)
    logp = torch.tensor([[ln2, ln2], [0.0, float("nan")]], requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0]])
    adv = torch.tensor([1.0, -1.0])
    loss, _ = gspo_loss(logp, torch.zeros(2, 2), adv, mask, 0.2, 2.0)
    loss.backward()
    assert abs(float(loss.detach()) + 0.5) < 1e-6
    assert torch.allclose(logp.grad, torch.tensor([[-0.5, -0.5], [0.5, 0.0]]))
    # clip 0.2/0.2: seq 0 (s = 2 > 1.2, A > 0) takes the clipped branch: no gradient there;
    # with denominator 4 (a minibatch of 4 sequences) seq 1's gradient halves to 0.25.
    logp.grad = None
    loss, _ = gspo_loss(logp, torch.zeros(2, 2), adv, mask, 0.2, 0.2, denominator=4)
    loss.backward()
    assert abs(float(loss.detach()) + (1.2 - 1) / 4) < 1e-6
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 0.0], [0.25, 0.0]]))


def test_gspo_loss_empty_rows_add_nothing():
    from rlvr.algorithms.sequence_losses import gspo_loss

    # row 1 has no valid token: D = 1 (not 2), and its advantage 5 is ignored: loss = -1 * 1
    loss, st = gspo_loss(
        torch.zeros(2, 2),
        torch.zeros(2, 2),
        torch.tensor([1.0, 5.0]),
        torch.tensor([[1, 1], [0, 0]]),
        0.2,
        0.2,
    )
    assert float(loss.detach()) == -1.0 and st["seq_ratio_max"] == 1.0


def test_gspo_loss_input_checks_name_the_field():
    import pytest

    from rlvr.algorithms.sequence_losses import gspo_loss

    z, m, a = torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2)
    with pytest.raises(ValueError, match="logp must be 2-D"):
        gspo_loss(torch.zeros(3), torch.zeros(3), a, torch.ones(3), 0.2, 0.2)
    with pytest.raises(ValueError, match="shape mismatch: logp=.*old_logp=\\(2, 2\\)"):
        gspo_loss(z, torch.zeros(2, 2), a, m, 0.2, 0.2)
    with pytest.raises(ValueError, match="advantages must be \\[N\\]=\\(2,\\)"):
        gspo_loss(z, z, torch.zeros(3), m, 0.2, 0.2)
    with pytest.raises(ValueError, match="mask must contain only 0 and 1"):
        gspo_loss(z, z, a, m * 2, 0.2, 0.2)
    with pytest.raises(ValueError, match="clip_low must be in \\[0, 1\\)"):
        gspo_loss(z, z, a, m, 1.0, 0.2)
    with pytest.raises(ValueError, match="clip_high must be >= 0"):
        gspo_loss(z, z, a, m, 0.2, -0.1)
    with pytest.raises(TypeError, match="advantages must be a torch.Tensor"):
        gspo_loss(z, z, [0.0, 0.0], m, 0.2, 0.2)


def test_cispo_loss_and_gradient_by_hand():
    from rlvr.algorithms.sequence_losses import cispo_loss

    # old log-probs 0, clip 0.2/0.2. seq 0: logp [ln2, 0], A = 1 -> ratios 2, 1 -> weights 1.2, 1.
    # seq 1: logp [ln0.5, pad], A = -2 -> ratio 0.5 -> weight 0.8. D = 3 valid tokens.
    # loss = -(1.2 * 1 * ln2 + 1 * 1 * 0 + 0.8 * -2 * ln0.5) / 3 = -(1.2 + 1.6) ln2 / 3
    # d loss / d logp_t = -w_t A_t / 3: [-0.4, -1/3] and [+1.6/3, 0]: the clipped tokens keep
    # their gradient (unlike PPO's clip, which would zero seq 0's first token).
    ln2 = math.log(2)
    logp = torch.tensor([[ln2, 0.0], [-ln2, float("nan")]], requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, st = cispo_loss(logp, torch.zeros(2, 2), torch.tensor([1.0, -2.0]), mask, 0.2, 0.2)
    loss.backward()
    assert abs(float(loss.detach()) + 2.8 * ln2 / 3) < 1e-6
    assert torch.allclose(logp.grad, torch.tensor([[-0.4, -1 / 3], [1.6 / 3, 0.0]]))
    assert abs(st["cispo_clip_frac"] - 2 / 3) < 1e-6
    assert abs(st["cispo_weight_min"] - 0.8) < 1e-6 and abs(st["cispo_weight_max"] - 1.2) < 1e-6


def test_cispo_loss_denominator_is_weights_and_no_lower_bound():
    from rlvr.algorithms.sequence_losses import cispo_loss

    # one token, logp = ln0.5 vs old 0 -> ratio 0.5; clip_low=1 (no lower bound) keeps 0.5;
    # IS weight 2 -> 1.0; A = 1; denominator 4: loss = -1.0 * ln0.5 / 4, grad = -1.0 / 4
    logp = torch.tensor([[-math.log(2)]], requires_grad=True)
    loss, st = cispo_loss(
        logp,
        torch.zeros(1, 1),
        torch.tensor([1.0]),
        torch.ones(1, 1),
        1.0,
        0.2,
        denominator=4,
        is_weights=torch.tensor([[2.0]]),
    )
    loss.backward()
    assert abs(float(loss.detach()) - math.log(2) / 4) < 1e-6
    assert torch.allclose(logp.grad, torch.tensor([[-0.25]]))
    assert st["cispo_clip_frac"] == 0.0


def test_gspo_token_loss_and_gradient_by_hand():
    from rlvr.algorithms.sequence_losses import gspo_token_loss

    # seq 0: log-ratios [0.1, 0.3] -> s0 = e^0.2 = 1.2214 (above 1 + 0.1); token advantages [1, -1]
    #   token 0: min(1.2214 * 1, 1.1 * 1) = 1.1, clipped: no gradient
    #   token 1: min(-1.2214, -1.1) = -1.2214, unclipped: d/d logp = -s0
    #   sequence mean (1.1 - 1.2214) / 2
    # seq 1: log-ratio [-0.2] (+ padding) -> s1 = e^-0.2 = 0.8187 (below 0.9); advantage [2]
    #   min(0.8187 * 2, 0.9 * 2) = 1.6375, unclipped: d/d logp = 2 s1
    # loss = -((1.1 - e^0.2) / 2 + 2 e^-0.2) / 2
    # gradient: [0, -(1/2)(1/2)(-e^0.2)] and [-(1/2)(2 e^-0.2), 0]
    s0, s1 = math.exp(0.2), math.exp(-0.2)
    logp = torch.tensor([[0.1, 0.3], [-0.2, float("nan")]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0], [2.0, 0.0]])
    loss, st = gspo_token_loss(
        logp, torch.zeros(2, 2), adv, torch.tensor([[1, 1], [1, 0]]), 0.1, 0.1
    )
    assert float(loss.detach()) == pytest.approx(-((1.1 - s0) / 2 + 2 * s1) / 2, rel=1e-6)
    loss.backward()
    expected = torch.tensor([[0.0, s0 / 4], [-s1, 0.0]])
    assert torch.allclose(logp.grad, expected, atol=1e-6)
    assert st["seq_clip_frac"] == 1.0
    assert (st["seq_ratio_min"], st["seq_ratio_max"]) == pytest.approx((s1, s0))


def test_gspo_token_equals_gspo_with_sequence_advantages():
    """Section 4.3: with every token given its sequence's advantage, GSPO-token's value and
    gradient are GSPO's (with a denominator, as the micro-batched update calls them)."""
    from rlvr.algorithms.sequence_losses import gspo_loss, gspo_token_loss

    torch.manual_seed(0)
    old = torch.randn(3, 4) * 0.1
    base = old + torch.randn(3, 4) * 0.05
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    adv = torch.tensor([0.7, -1.3, 0.4])
    grads = []
    for fn, a in ((gspo_loss, adv), (gspo_token_loss, adv[:, None].expand(3, 4))):
        logp = base.clone().requires_grad_(True)
        loss, _ = fn(logp, old, a, mask, 0.02, 0.03, denominator=5)
        loss.backward()
        grads.append((float(loss), logp.grad))
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-6)
    assert torch.allclose(grads[0][1], grads[1][1], atol=1e-7)


def test_gspo_token_loss_weights_each_token_term():
    from rlvr.algorithms.sequence_losses import gspo_token_loss

    # ratios all 1 (logp == old): loss = -mean over the one sequence of w_t * A_t
    # = -(0.5 * 2 + 0 * 4) / 2 = -0.5
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, _ = gspo_token_loss(
        logp,
        torch.zeros(1, 2),
        torch.tensor([[2.0, 4.0]]),
        torch.ones(1, 2),
        3e-4,
        4e-4,
        is_weights=torch.tensor([[0.5, 0.0]]),
    )
    assert float(loss.detach()) == pytest.approx(-0.5)
