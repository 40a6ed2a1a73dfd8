"""algo.rollout_correction and algo.tis_cap (its token/truncate case): importance weights of the
trainer's old log-probs against the engine's, weighting each token's policy-gradient term."""

from __future__ import annotations

import math

import pytest
import torch
from test_train_e2e import tiny_config

from rlvr.config import RolloutCorrectionConfig, load_config
from rlvr.objectives.batch import RolloutBatch
from rlvr.rollout.base import Completion
from rlvr.training.preflight.checks import config_problems
from rlvr.training.rollout_correction import correction_weights
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
    # algo.tis_cap=2 is the token/truncate correction with cap 2
    rc = load_config(None, ["algo.tis_cap=2"]).algo.correction()
    assert rc == RolloutCorrectionConfig(level="token", action="truncate", cap=2.0)
    st = correction_weights(batch, rc)
    assert batch.tok["tis_weights"][0].tolist() == pytest.approx([1.0, 2.0])
    assert batch.tok["tis_weights"][1].tolist() == pytest.approx([0.5])
    assert st["tis_weight_mean"] == pytest.approx(4.5 / 4)
    assert (st["tis_weight_min"], st["tis_weight_max"]) == pytest.approx((0.5, 2.0))
    assert st["tis_truncated_frac"] == pytest.approx(1 / 4) and st["tis_masked_frac"] == 0.0
    # sequence mask [1/2, 2]: products 3 (dropped), 0.5 and 1 (kept, weighted by their ratio);
    # the invalid sequence's e^5 does not count: 2 of 4 valid tokens masked
    st = correction_weights(batch, RolloutCorrectionConfig(level="sequence", action="mask"))
    assert [w.tolist() for w in batch.tok["tis_weights"]] == [[0.0, 0.0], [0.5], [0.0], [1.0]]
    assert st["tis_masked_frac"] == pytest.approx(2 / 4)
    assert st["tis_weight_mean"] == pytest.approx(1.5 / 4)
    # geometric reject [1/2, 2]: sqrt(3) = 1.73, 0.5, 1 are all kept, each weighted 1
    st = correction_weights(batch, RolloutCorrectionConfig(level="geometric", action="reject"))
    assert [w.tolist() for w in batch.tok["tis_weights"]] == [[1.0, 1.0], [1.0], [0.0], [1.0]]
    assert (st["tis_weight_mean"], st["tis_masked_frac"]) == (1.0, 0.0)
    # token mask [1/2, 2]: the ratio 3 is dropped, the kept tokens keep their ratios
    st = correction_weights(batch, RolloutCorrectionConfig(level="token", action="mask"))
    assert batch.tok["tis_weights"][0].tolist() == [1.0, 0.0]
    assert batch.tok["tis_weights"][1].tolist() == pytest.approx([0.5])
    assert st["tis_masked_frac"] == pytest.approx(1 / 4)
    assert st["tis_weight_mean"] == pytest.approx(2.5 / 4)


@pytest.mark.parametrize(
    "objective, correction",
    [
        ("drgrpo", ["algo.tis_cap=0.5"]),
        ("cispo", ["algo.tis_cap=0.5"]),
        ("drgrpo", ["algo.rollout_correction.level=token", "algo.rollout_correction.cap=0.5"]),
        ("drgrpo", ["algo.rollout_correction.level=sequence", "algo.rollout_correction.cap=0.5"]),
        (
            "gspo_token",
            ["algo.rollout_correction.level=sequence", "algo.rollout_correction.cap=0.5"],
        ),
    ],
)
def test_a_binding_cap_scales_the_policy_gradient(tiny_model_dir, tmp_path, objective, correction):
    """The hf engine samples with the trainer's own module, so every engine/trainer ratio is 1 to
    rounding: with a truncation cap of 0.5 (algo.tis_cap, or the correction by token or by
    sequence) every weight is 0.5, every token is truncated, and the policy loss and the gradient
    norm are exactly half those of the same step without the cap."""
    metrics = {}
    for name, extra in {"off": [], "cap": correction}.items():
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
    assert cap["tis_truncated_frac"] == 1.0 and cap["tis_masked_frac"] == 0.0
    assert off["grad_norm"] > 0
    assert cap["policy_loss"] == pytest.approx(0.5 * off["policy_loss"], rel=1e-4)
    assert cap["grad_norm"] == pytest.approx(0.5 * off["grad_norm"], rel=1e-4)


def test_a_sequence_rejection_that_keeps_everything_changes_nothing(
    tiny_model_dir, tmp_path, capsys
):
    """Ratios 1 to rounding lie inside [1/2, 2]: every weight 1 (reject weighs a kept sequence
    1), nothing masked, the policy loss and gradient norm equal those without the correction.
    The run's first lines say which correction is in force and how to turn it off."""
    metrics, banners = {}, {}
    for name, extra in {
        "off": [],
        "mask": ["algo.rollout_correction.level=sequence", "algo.rollout_correction.action=reject"],
    }.items():
        torch.manual_seed(0)
        cfg = tiny_config(
            tiny_model_dir,
            tmp_path / name,
            "model.autocast=off",
            "train.max_steps=1",
            "train.threads=1",
            "eval.before_after=false",
            *extra,
        )
        trainer = Trainer(cfg)
        capsys.readouterr()
        trainer._banner()
        banners[name] = capsys.readouterr().out
        metrics[name] = trainer.train_step()
        trainer.run.close()
    assert "rollout correction" not in banners["off"]
    assert (
        "[rlvr] rollout correction: sequence reject, ratios kept in [0.5, 2], weighted 1 "
        "(algo.rollout_correction.level=off turns it off" in banners["mask"]
    )
    off, mask = metrics["off"], metrics["mask"]
    assert (mask["tis_weight_min"], mask["tis_masked_frac"]) == (1.0, 0.0)
    assert mask["policy_loss"] == pytest.approx(off["policy_loss"], rel=1e-5)
    assert mask["grad_norm"] == pytest.approx(off["grad_norm"], rel=1e-5)


def test_objectives_without_a_token_term_refuse_the_cap():
    for objective in ("gspo", "maxent_listwise"):
        cfg = load_config(None, [f"algo.objective={objective}", "algo.tis_cap=2"])
        assert config_problems(cfg) == [
            f"algo.tis_cap is not supported by algo.objective={objective} (it has no per-token "
            "policy-gradient term to weight); leave algo.tis_cap null"
        ]
        cfg = load_config(
            None, [f"algo.objective={objective}", "algo.rollout_correction.level=sequence"]
        )
        assert config_problems(cfg) == [
            f"algo.rollout_correction is not supported by algo.objective={objective} (it has no "
            "per-token policy-gradient term to weight); leave algo.rollout_correction at level=off"
        ]


def test_correction_settings_that_cannot_combine_are_named():
    both = ["algo.tis_cap=2", "algo.rollout_correction.level=token"]
    assert config_problems(load_config(None, both)) == [
        "algo.tis_cap and algo.rollout_correction are both set: algo.tis_cap=C is "
        "algo.rollout_correction level=token action=truncate cap=C; keep one"
    ]
    narrow = ["algo.rollout_correction.level=token", "algo.rollout_correction.action=mask"]
    assert config_problems(load_config(None, [*narrow, "algo.rollout_correction.cap=0.9"])) == [
        "algo.rollout_correction: the mask keeps ratios in [low=1.11111, cap=0.9], which must "
        "contain 1 (low < 1 < cap)"
    ]
    low = ["algo.rollout_correction.level=token", "algo.rollout_correction.low=0.5"]
    assert config_problems(load_config(None, low)) == [
        "algo.rollout_correction.low is the mask's lower bound: set action=mask (or reject)"
    ]
