"""rlvr.algorithms.rollout_correction_weights: each level and action by hand."""

import math

import pytest
import torch

from rlvr.algorithms import rollout_correction_weights, truncated_is_weights

# trainer - engine log-prob per token; row 1 has one token (the second is padding, NaN)
LN = math.log
DIFF = torch.tensor([[0.0, LN(3)], [-LN(2), float("nan")], [LN(1.5), LN(1 / 6)]])
MASK = torch.tensor([[1, 1], [1, 0], [1, 1]])


def _weights(**kw):
    w, truncated, masked = rollout_correction_weights(DIFF, torch.zeros(3, 2), MASK, **kw)
    return w.tolist(), truncated.tolist(), masked.tolist()


def _close(got: list, want: list) -> bool:
    return torch.allclose(torch.tensor(got), torch.tensor(want), atol=1e-6)


def test_token_truncate_is_tis():
    # ratios [1, 3], [0.5], [1.5, 1/6]; cap 2: 3 -> 2 (truncated)
    w, tr, ms = _weights(level="token", action="truncate", cap=2.0)
    assert _close(w, [[1.0, 2.0], [0.5, 0.0], [1.5, 1 / 6]])
    assert tr == [[False, True], [False, False], [False, False]]
    assert ms == [[False] * 2] * 3
    # the same numbers as algo.tis_cap's truncated_is_weights on the valid tokens
    tis = truncated_is_weights(torch.nan_to_num(DIFF), torch.zeros(3, 2), 2.0) * MASK
    assert torch.equal(torch.tensor(w), tis)


def test_token_mask_keeps_ratios_inside_one_over_cap_to_cap():
    # [1/2, 2]: 3 and 1/6 leave it (masked); 0.5 is on the edge and stays
    w, tr, ms = _weights(level="token", action="mask", cap=2.0)
    assert w == [[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]
    assert ms == [[False, True], [False, False], [False, True]]
    assert tr == [[False] * 2] * 3


def test_icepop_two_sided_mask_with_its_own_bounds():
    # IcePop-style [0.5, 5]: 3 stays, 1/6 is masked
    w, _, ms = _weights(level="token", action="mask", cap=5.0, low=0.5)
    assert w == [[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]]
    assert ms == [[False, False], [False, False], [False, True]]


def test_sequence_level_is_the_geometric_mean_of_the_token_ratios():
    # row 0: sqrt(1 * 3) = 1.732; row 1: 0.5; row 2: sqrt(1.5 / 6) = 0.5
    r0 = math.sqrt(3)
    w, tr, _ = _weights(level="sequence", action="truncate", cap=2.0)
    assert _close(w, [[r0, r0], [0.5, 0.0], [0.5, 0.5]])
    assert tr == [[False] * 2] * 3
    w, tr, _ = _weights(level="sequence", action="truncate", cap=1.5)
    assert _close(w, [[1.5, 1.5], [0.5, 0.0], [0.5, 0.5]])
    assert tr == [[True, True], [False, False], [False, False]]


def test_sequence_mask_drops_whole_sequences():
    # [1/2, 2]: every sequence ratio (1.732, 0.5, 0.5) stays, though tokens 3 and 1/6 would not
    w, _, ms = _weights(level="sequence", action="mask", cap=2.0)
    assert w == [[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]]
    # [0.6, 2]: rows 1 and 2 (0.5) are dropped whole
    w, _, ms = _weights(level="sequence", action="mask", cap=2.0, low=0.6)
    assert w == [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    assert ms == [[False, False], [True, False], [True, True]]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="level"):
        _weights(level="batch", action="mask", cap=2.0)
    with pytest.raises(ValueError, match="action"):
        _weights(level="token", action="clip", cap=2.0)
    with pytest.raises(ValueError, match=r"must contain 1"):
        _weights(level="token", action="mask", cap=0.5)
