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
