"""End-to-end runs on a tiny random model: every objective runs with finite metrics, and learns."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlvr.config import load_config
from rlvr.training.trainer import Trainer

# Keys every step's metrics line must carry (the JSONL contract), whatever the objective.
REQUIRED = [
    "step",
    "reward_mean",
    "reward_std",
    "reward_min",
    "reward_max",
    "reward_p90",
    "reward_failure_rate",
    "response_len_mean",
    "response_len_max",
    "truncation_rate",
    "zero_var_group_frac",
    "policy_loss",
    "grad_norm",
    "entropy_mean",
    "entropy_p10",
    "entropy_p90",
    "lr",
    "adv_mean",
    "adv_std",
    "adv_min",
    "adv_max",
    "log_ratio_max",
    "ratio_max",
    "logprob_diff_mean",
    "logprob_diff_max",
    "logprob_k3",
    "nonfinite_skipped",
    "time_rollout",
    "time_reward",
    "time_update",
    "time_step",
    "gen_tokens_per_s",
]
PPO_STATS = [
    "clip_frac_low",
    "clip_frac_high",
    "approx_kl",
    "log_ratio_abs_p99",
    "ratio_mean",
    "ratio_min",
]


def tiny_config(model_dir: Path, out: Path, *overrides: str):
    return load_config(
        None,
        [
            f"model.name_or_path={model_dir}",
            f"train.output_dir={out}",
            "data.template=none",
            "rollout.max_new_tokens=8",
            "logging.progress=false",
            "eval.max_problems=8",
            "reward.specs=[{name: 'toy_rewards:count_sevens'}]",
            "train.max_steps=3",
            *overrides,
        ],
    )


def one_float32_step(model_dir: Path, out: Path, *overrides: str, before=None):
    """One float32 step of the tiny model (seed 0, lr 1e-2, one thread, no evals): its metrics,
    the weights after it, and what ``before(trainer)`` returned (called before the step)."""
    import torch

    torch.manual_seed(0)
    trainer = Trainer(
        tiny_config(
            model_dir,
            out,
            "model.autocast=off",
            "train.lr=1e-2",
            "train.max_steps=1",
            "train.threads=1",
            "eval.before_after=false",
            *overrides,
        )
    )
    try:
        watched = before(trainer) if before is not None else None
        metrics = trainer.train_step()
        weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    finally:
        trainer.run.close()
    return metrics, weights, watched


def read_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "objective, extra",
    [
        ("drgrpo", []),
        ("grpo", []),
        ("rloo", []),
        ("ppo", ["algo.epochs_per_batch=2"]),
        ("maxent_listwise", []),
        (
            "drgrpo",
            [
                "algo.beta=0.1",
                "algo.minibatches=2",
                "algo.epochs_per_batch=2",
                "algo.clip_high=0.28",
            ],
        ),
        ("maxent_listwise", ["algo.beta=0.05", "algo.minibatches=2"]),
    ],
)
def test_each_objective_runs_with_finite_metrics(tiny_model_dir, tmp_path, objective, extra):
    cfg = tiny_config(tiny_model_dir, tmp_path, f"algo.objective={objective}", *extra)
    summary = Trainer(cfg).fit()
    run_dir = Path(summary["run_dir"])
    assert objective in run_dir.name  # runs of different objectives never share a directory
    lines = [m for m in read_lines(run_dir) if "reward_mean" in m]
    assert [m["step"] for m in lines] == [1, 2, 3]
    for m in lines:
        keys = REQUIRED + PPO_STATS
        if "algo.beta=0.1" in extra or "algo.beta=0.05" in extra:
            keys = keys + ["kl"]
        missing = [k for k in keys if k not in m]
        assert not missing, f"{objective}: missing {missing}"
        bad = {
            k: m[k] for k in keys if not (isinstance(m[k], (int, float)) and math.isfinite(m[k]))
        }
        assert not bad, f"{objective}: non-finite {bad}"
        assert m["nonfinite_skipped"] == 0.0
    # the final model is a loadable HF folder and the run says it finished
    assert (run_dir / "final" / "config.json").exists()
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"
    assert "eval/heldout/greedy_pass@1" in read_lines(run_dir)[0]


def test_multiple_updates_per_batch_move_the_ratio(tiny_model_dir, tmp_path):
    """With two epochs over a batch the second pass sees ratios != 1 (old log-probs are kept)."""
    cfg = tiny_config(
        tiny_model_dir, tmp_path, "algo.epochs_per_batch=2", "train.lr=1e-2", "train.max_steps=2"
    )
    run_dir = Path(Trainer(cfg).fit()["run_dir"])
    m = [x for x in read_lines(run_dir) if "ratio_max" in x][0]
    assert m["optimizer_steps"] == 2.0
    assert m["ratio_max"] > 1.0 + 1e-4 or m["ratio_min"] < 1.0 - 1e-4


@pytest.mark.parametrize(
    "objective, extra",
    [
        ("drgrpo", []),
        ("grpo", []),
        ("rloo", []),
        # rewards here lie in [0, 0.2]: q = softmax(r / 2.0) would be almost uniform, so sharpen q
        ("maxent_listwise", ["algo.maxent.q_temperature=0.05"]),
        ("gspo", ["algo.clip_low=3e-4", "algo.clip_high=4e-4"]),
        ("cispo", []),
    ],
)
def test_reward_goes_up_on_a_learnable_task(tiny_model_dir, tmp_path, objective, extra):
    """Reward = fraction of '7' characters. A random model starts near 1/100 per character;
    after 15 steps at lr 1e-2 the policy must emit clearly more sevens."""
    cfg = tiny_config(
        tiny_model_dir,
        tmp_path,
        f"algo.objective={objective}",
        "train.lr=1e-2",
        "train.max_steps=15",
        "eval.before_after=false",
        *extra,
    )
    run_dir = Path(Trainer(cfg).fit()["run_dir"])
    rewards = [m["reward_mean"] for m in read_lines(run_dir) if "reward_mean" in m]
    start = sum(rewards[:3]) / 3
    end = sum(rewards[-3:]) / 3
    assert start < 0.1
    assert end > start + 0.3, rewards


@pytest.fixture(scope="module")
def tiny_prm_dir(tmp_path_factory) -> Path:
    """A random token-classification PRM over the char tokenizer (tag token '@')."""
    from transformers import AutoModelForTokenClassification, LlamaConfig

    from rlvr.training.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
    )
    out = tmp_path_factory.mktemp("prm") / "prm"
    AutoModelForTokenClassification.from_config(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_psgrpo_reward_with_a_token_classification_prm(tiny_model_dir, tiny_prm_dir, tmp_path):
    """Scalar PS-GRPO reward scored by a tiny HF PRM; every lowercase letter starts a 'step' so the
    PRM really scores steps of the random policy's text."""
    spec = (
        f"reward.specs=[{{name: psgrpo, kwargs: {{prm: '{tiny_prm_dir}', tag_token: '@', "
        f"step_pattern: '[a-z]', min_steps: 0}}}}]"
    )
    cfg = tiny_config(tiny_model_dir, tmp_path, spec)
    run_dir = Path(Trainer(cfg).fit()["run_dir"])
    lines = [m for m in read_lines(run_dir) if "reward_mean" in m]
    assert len(lines) == 3
    for m in lines:
        assert m["step_count"] > 0  # the PRM saw steps
        for k in (
            "reward_mean",
            "policy_loss",
            "grad_norm",
            "has_drop_moment",
            "max_relative_drop",
        ):
            assert math.isfinite(m[k]), k


@pytest.mark.parametrize("objective", ["psgrpo_steps", "prm_dense"])
def test_prm_objectives_give_token_advantages(objective, tiny_model_dir, tmp_path):
    cfg = tiny_config(
        tiny_model_dir,
        tmp_path,
        f"algo.objective={objective}",
        "algo.psgrpo.prm=toy_rewards:toy_prm",
        "algo.psgrpo.step_pattern='[a-z]'",
        "rollout.max_new_tokens=16",
    )
    run_dir = Path(Trainer(cfg).fit()["run_dir"])
    lines = [m for m in read_lines(run_dir) if "reward_mean" in m]
    assert len(lines) == 3
    for m in lines:
        assert m["step_count_mean"] > 0 and 0 < m["step_score_mean"] <= 1.0
        assert all(math.isfinite(m[k]) for k in ("policy_loss", "grad_norm", "adv_std"))
    # token advantages vary across tokens, so some sequence-mean advantage is non-zero
    assert any(m["adv_std"] > 0 for m in lines)
