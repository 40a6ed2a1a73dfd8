import math

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
    assert abs(float(loss) + 0.1) < 1e-6
    assert st["seq_clip_frac"] == 0.5 and abs(st["seq_ratio_max"] - 2.0) < 1e-6
