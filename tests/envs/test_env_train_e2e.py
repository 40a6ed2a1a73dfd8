"""`rlvr train env.name=package.module:Class` with a user environment runs end to end on a tiny
model (a real `rlvr train` process), and PPO and GRPO train on episodes with the environment's
tokens masked out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.config import load_config
from rlvr.telemetry.keys import EPISODE_KEYS
from rlvr.telemetry.samples import samples_path
from rlvr.training.trainer import Trainer

COMMON = [
    "data.template=chat",
    "data.max_prompt_tokens=128",
    "rollout.max_new_tokens=10",
    "rollout.max_episode_tokens=64",
    "rollout.max_turns=3",
    "algo.prompts_per_step=2",
    "algo.group_size=3",
    "train.max_steps=2",
    "eval.before_after=false",
    "logging.progress=false",
    "logging.samples_every=1",
]


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_rlvr_train_with_a_user_environment_class(tiny_model_dir, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlvr",
            "train",
            f"model.name_or_path={tiny_model_dir}",
            f"train.output_dir={tmp_path}",
            "train.run_name=user-env",
            "env.name=user_envs:CountDown",
            "env.kwargs.start=2",
            *COMMON,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "user-env"
    lines = read_metrics(run_dir)
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert set(EPISODE_KEYS) <= set(m)
        assert 1.0 <= m["turns_mean"] <= 2.0  # CountDown(start=2) ends after 2 model turns
        assert m["env_failure_rate"] == 0.0
        assert m["episode_env_tokens_mean"] > 0
        # the health gate's length rules read response_len_*: the model's tokens only
        assert m["response_len_mean"] == pytest.approx(m["episode_model_tokens_mean"])
    samples = [json.loads(x) for x in samples_path(run_dir, 1).read_text().splitlines()]
    assert len(samples) == 6
    roles = [t["role"] for t in samples[0]["turns"]]
    assert roles[0] == "model" and roles[-1] == "model" and len(roles) in (1, 3)
    assert samples[0]["model_tokens"] + samples[0]["env_tokens"] == samples[0]["tokens"]


@pytest.mark.parametrize("objective", ["ppo", "grpo"])
def test_objectives_train_on_episodes(tiny_model_dir, tmp_path, objective):
    cfg = load_config(
        None,
        [
            f"model.name_or_path={tiny_model_dir}",
            f"train.output_dir={tmp_path}",
            "env.name=user_envs:CountDown",
            f"algo.objective={objective}",
            "algo.tis_cap=2.0" if objective == "grpo" else "algo.epochs_per_batch=2",
            "algo.beta=0.05",
            *COMMON,
        ],
    )
    summary = Trainer(cfg).fit()
    lines = read_metrics(Path(summary["run_dir"]))
    assert len(lines) == 2
    for m in lines:
        assert m["turns_mean"] >= 1.0
        for key in ("policy_loss", "grad_norm", "logprob_diff_max", "kl"):
            assert key in m and m[key] == m[key]  # present and not NaN
        assert m["logprob_diff_max"] < 1e-3  # the engine's log-probs at the model's tokens
        if objective == "grpo":
            assert m["tis_weight_max"] == pytest.approx(1.0, abs=1e-3)
