"""algo.tis_cap: truncated importance sampling of the trainer's old log-probs against the
engine's, weighting each token's policy-gradient term."""

from __future__ import annotations

import math

import pytest
import torch
from test_train_e2e import tiny_config

from rlvr.config import load_config
from rlvr.objectives.batch import RolloutBatch
from rlvr.rollout.base import Completion
from rlvr.training.preflight.checks import config_problems
from rlvr.training.step import tis_weights
from rlvr.training.trainer import Trainer


def test_weights_and_statistics_by_hand():
    # seq 0: trainer [0, ln3] vs engine [0, 0] -> ratios 1, 3 -> cap 2 -> weights 1, 2 (one cut)
    # seq 1: trainer [-ln2] vs engine [0] -> 0.5. seq 2 is invalid (its ratio e^5 is ignored);
    # seq 3: ratio 1 -> 1. Over the 4 valid tokens: mean (1 + 2 + 0.5 + 1) / 4, min 0.5, max 2,
    # truncated 1/4.
    comps = [Completion(0, [1] * n, [0.0] * n, "", "stop") for n in (2, 1, 1)] + [
        Completion(0, [1], [0.0], "", "stop")
    ]
    batch = RolloutBatch([{}], ["p"], [[1]], [comps], group_size=4)
    batch.valid = torch.tensor([[True, True, False, True]])
    batch.old_logp = [
        torch.tensor([0.0, math.log(3)]),
        torch.tensor([-math.log(2)]),
        torch.tensor([5.0]),
        torch.tensor([0.0]),
    ]
    batch.tok["engine_logp"] = [torch.zeros(len(x)) for x in batch.old_logp]
    st = tis_weights(batch, 2.0)
    assert batch.tok["tis_weights"][0].tolist() == pytest.approx([1.0, 2.0])
    assert batch.tok["tis_weights"][1].tolist() == pytest.approx([0.5])
    assert st["tis_weight_mean"] == pytest.approx(4.5 / 4)
    assert (st["tis_weight_min"], st["tis_weight_max"]) == pytest.approx((0.5, 2.0))
    assert st["tis_truncated_frac"] == pytest.approx(1 / 4)


@pytest.mark.parametrize("objective", ["drgrpo", "cispo"])
def test_a_binding_cap_scales_the_policy_gradient(tiny_model_dir, tmp_path, objective):
    """The hf engine samples with the trainer's own module, so every engine/trainer ratio is 1 to
    rounding: with tis_cap=0.5 every weight is 0.5, every token is truncated, and the policy loss
    and the gradient norm are exactly half those of the same step without the cap."""
    metrics = {}
    for name, extra in {"off": [], "cap": ["algo.tis_cap=0.5"]}.items():
        torch.manual_seed(0)
        cfg = tiny_config(
            tiny_model_dir,
            tmp_path / name,
            f"algo.objective={objective}",
            "model.autocast=off",
            "train.max_steps=1",
            "train.threads=1",
            "train.max_grad_norm=1000",
            "eval.before_after=false",
            *extra,
        )
        trainer = Trainer(cfg)
        metrics[name] = trainer.train_step()
        trainer.run.close()
    off, cap = metrics["off"], metrics["cap"]
    assert "tis_weight_mean" not in off
    assert cap["logprob_diff_max"] < 1e-3  # the premise: engine and trainer agree
    assert cap["tis_weight_mean"] == pytest.approx(0.5) and cap["tis_weight_max"] == 0.5
    assert cap["tis_truncated_frac"] == 1.0
    assert off["grad_norm"] > 0
    assert cap["policy_loss"] == pytest.approx(0.5 * off["policy_loss"], rel=1e-4)
    assert cap["grad_norm"] == pytest.approx(0.5 * off["grad_norm"], rel=1e-4)


def test_objectives_without_a_token_term_refuse_the_cap():
    for objective, extra in (
        ("gspo", ["algo.clip_low=3e-4", "algo.clip_high=4e-4"]),
        ("maxent_listwise", []),
    ):
        cfg = load_config(None, [f"algo.objective={objective}", "algo.tis_cap=2", *extra])
        assert config_problems(cfg) == [
            f"algo.tis_cap is not supported by algo.objective={objective} (it has no per-token "
            "policy-gradient term to weight); leave algo.tis_cap null"
        ]
