"""The gradient comparison against TRL: its arithmetic by hand and TRL's batch layout."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.studies.grad_trl_side import trl_micro_batch
from benchmarks.studies.grad_vs_trl import compare_grads


def test_compare_grads_by_hand():
    a = {"w": torch.tensor([3.0, 0.0]), "b": torch.tensor([0.0])}
    same_direction = {"w": torch.tensor([6.0, 0.0]), "b": torch.tensor([0.0])}
    c = compare_grads(a, same_direction)
    assert c["norm_ratio"] == pytest.approx(0.5)
    assert c["unit_diff"] == pytest.approx(0.0)
    # orthogonal: |(1, 0) - (0, 1)| = sqrt(2); the worst tensor is w, |(3,0)-(0,3)|/3 = sqrt(2)
    orthogonal = {"w": torch.tensor([0.0, 3.0]), "b": torch.tensor([1e-30])}
    c = compare_grads({"w": a["w"], "b": torch.tensor([1e-30])}, orthogonal)
    assert c["unit_diff"] == pytest.approx(math.sqrt(2))
    assert (c["worst_tensor"], c["worst_rel_diff"]) == ("w", pytest.approx(math.sqrt(2)))
    with pytest.raises(ValueError, match="parameter names differ"):
        compare_grads(a, {"w": a["w"]})
    with pytest.raises(ValueError, match="a gradient is zero"):
        compare_grads(a, {k: torch.zeros_like(v) for k, v in a.items()})


def test_trl_layout_left_pads_prompts_and_right_pads_replies():
    mb = trl_micro_batch([[5, 6, 7], [8]], [[1], [2, 3, 4]], [0.5, -0.5], pad_id=0)
    assert mb["prompt_ids"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mb["prompt_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert mb["completion_ids"].tolist() == [[1, 0, 0], [2, 3, 4]]
    assert mb["completion_mask"].tolist() == [[1, 0, 0], [1, 1, 1]]
    assert mb["advantages"].tolist() == [0.5, -0.5]
