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


def test_token_mask_keeps_the_ratio_of_a_kept_token_as_trl_and_verl_do():
    # [1/2, 2]: 3 and 1/6 leave it (weight 0, masked); a kept token keeps its ratio as its
    # weight (TRL token_mask: ratio.masked_fill(outside, 0); verl: IS weights times the RS mask)
    w, tr, ms = _weights(level="token", action="mask", cap=2.0)
    assert _close(w, [[1.0, 0.0], [0.5, 0.0], [1.5, 0.0]])
    assert ms == [[False, True], [False, False], [False, True]]
    assert tr == [[False] * 2] * 3


def test_token_reject_weights_a_kept_token_one():
    # the rejection alone (verl's rollout_rs without rollout_is): kept 1, rejected 0
    w, _, ms = _weights(level="token", action="reject", cap=2.0)
    assert w == [[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]
    assert ms == [[False, True], [False, False], [False, True]]


def test_icepop_two_sided_mask_with_its_own_bounds():
    # IcePop-style [0.5, 5]: 3 stays with weight 3, 1/6 is masked
    w, _, ms = _weights(level="token", action="mask", cap=5.0, low=0.5)
    assert _close(w, [[1.0, 3.0], [0.5, 0.0], [1.5, 0.0]])
    assert ms == [[False, False], [False, False], [False, True]]


def test_sequence_level_is_the_product_of_the_token_ratios():
    # row 0: 1 * 3 = 3; row 1: 0.5; row 2: 1.5 / 6 = 0.25 (verl rollout_is="sequence", TRL
    # sequence_truncate: exp of the summed log-ratios)
    w, tr, _ = _weights(level="sequence", action="truncate", cap=2.0)
    assert _close(w, [[2.0, 2.0], [0.5, 0.0], [0.25, 0.25]])
    assert tr == [[True, True], [False, False], [False, False]]
    w, tr, _ = _weights(level="sequence", action="truncate", cap=4.0)
    assert _close(w, [[3.0, 3.0], [0.5, 0.0], [0.25, 0.25]])
    assert tr == [[False] * 2] * 3


def test_a_small_systematic_gap_compounds_over_a_long_sequence():
    # 0.005 nats on each of 400 tokens: the sequence ratio is e^2 = 7.39, outside [1/2, 2],
    # so the sequence mask drops it; the geometric mean (e^0.005) would keep it
    diff = torch.full((1, 400), 0.005)
    mask = torch.ones(1, 400)
    w, _, ms = rollout_correction_weights(
        diff, torch.zeros(1, 400), mask, level="sequence", action="mask", cap=2.0
    )
    assert float(w.max()) == 0.0 and bool(ms.all())
    w, tr, _ = rollout_correction_weights(
        diff, torch.zeros(1, 400), mask, level="sequence", action="truncate", cap=10.0
    )
    assert abs(float(w[0, 0]) - math.exp(2.0)) < 1e-3 and not bool(tr.any())
    w, _, ms = rollout_correction_weights(
        diff, torch.zeros(1, 400), mask, level="geometric", action="mask", cap=2.0
    )
    assert abs(float(w[0, 0]) - math.exp(0.005)) < 1e-6 and not bool(ms.any())


def test_the_sequence_log_ratio_is_clamped_before_exp_as_verl_does():
    # a 100-nat sum would overflow float32's exp; verl clamps the sum to [-20, 20] first
    diff = torch.full((2, 50), 2.0)
    diff[1] = -2.0
    w, tr, _ = rollout_correction_weights(
        diff,
        torch.zeros(2, 50),
        torch.ones(2, 50),
        level="sequence",
        action="truncate",
        cap=1e12,
    )
    assert torch.isfinite(w).all()
    assert abs(float(w[0, 0]) / math.exp(20.0) - 1) < 1e-5
    assert abs(float(w[1, 0]) / math.exp(-20.0) - 1) < 1e-5


def test_geometric_level_is_the_geometric_mean_of_the_token_ratios():
    # row 0: sqrt(1 * 3) = 1.732; row 1: 0.5; row 2: sqrt(1.5 / 6) = 0.5
    r0 = math.sqrt(3)
    w, tr, _ = _weights(level="geometric", action="truncate", cap=2.0)
    assert _close(w, [[r0, r0], [0.5, 0.0], [0.5, 0.5]])
    assert tr == [[False] * 2] * 3
    w, tr, _ = _weights(level="geometric", action="truncate", cap=1.5)
    assert _close(w, [[1.5, 1.5], [0.5, 0.0], [0.5, 0.5]])
    assert tr == [[True, True], [False, False], [False, False]]


def test_sequence_mask_drops_whole_sequences():
    # [1/2, 2]: sequence ratios 3, 0.5, 0.25: row 0 and row 2 leave it, row 1 stays (weight 0.5)
    w, _, ms = _weights(level="sequence", action="mask", cap=2.0)
    assert _close(w, [[0.0, 0.0], [0.5, 0.0], [0.0, 0.0]])
    assert ms == [[True, True], [False, False], [True, True]]
    # [0.2, 4]: every sequence stays, each weighted by its ratio
    w, _, ms = _weights(level="sequence", action="mask", cap=4.0, low=0.2)
    assert _close(w, [[3.0, 3.0], [0.5, 0.0], [0.25, 0.25]])
    assert not any(any(r) for r in ms)
    # the geometric mean's [1/2, 2] keeps all three (1.732, 0.5, 0.5); reject weights them 1
    w, _, ms = _weights(level="geometric", action="reject", cap=2.0)
    assert w == [[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="level"):
        _weights(level="batch", action="mask", cap=2.0)
    with pytest.raises(ValueError, match="action"):
        _weights(level="token", action="clip", cap=2.0)
    with pytest.raises(ValueError, match=r"must contain 1"):
        _weights(level="token", action="mask", cap=0.5)


def test_low_zero_is_trls_one_sided_mask():
    # TRL's token_mask / sequence_mask with vllm_importance_sampling_clip_min unset (its
    # default) masks only ratios above C_max: 1/6 and 0.5 keep their ratio; 3 > 2 is masked
    w, _, ms = _weights(level="token", action="mask", cap=2.0, low=0.0)
    assert _close(w, [[1.0, 0.0], [0.5, 0.0], [1.5, 1 / 6]])
    assert ms == [[False, True], [False, False], [False, False]]
    # sequence level: row 0's product 3 is masked, row 2's 0.25 is kept with its weight
    w, _, _ = _weights(level="sequence", action="mask", cap=2.0, low=0.0)
    assert _close(w, [[0.0, 0.0], [0.5, 0.0], [0.25, 0.25]])


def test_the_config_takes_low_zero_for_the_one_sided_mask():
    from rlvr.config import load_config
    from rlvr.config.validate import problems

    cfg = load_config(
        None,
        [
            "algo.rollout_correction.level=token",
            "algo.rollout_correction.action=mask",
            "algo.rollout_correction.low=0",
        ],
    )
    assert cfg.algo.rollout_correction.bounds() == (0.0, 2.0)
    assert not [p for p in problems(cfg) if "rollout_correction" in p]
