"""Agents train end to end on a tiny model through the OpenAI endpoint: an OpenAI-client agent
(`env.name=agent:...`), one that rewrites its history (split sequences, counted), a verifiers
environment (`env.name=verifiers:...`), and two ranks each serving their own episodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.training.dist_support import TORCHRUN, run, steps

from rlvr.config import ConfigError, load_config
from rlvr.telemetry.samples import samples_path
from rlvr.training.trainer import Trainer

pytest.importorskip("openai")

COMMON = [
    "data.template=chat",
    "data.max_prompt_tokens=128",
    "rollout.max_new_tokens=12",
    "rollout.max_episode_tokens=900",
    "rollout.max_turns=3",
    "algo.prompts_per_step=2",
    "algo.group_size=3",
    "algo.objective=grpo",
    "algo.beta=0.05",
    "train.max_steps=2",
    "eval.before_after=false",
    "logging.progress=false",
    "logging.samples_every=1",
    "env.timeout_s=120",
]


@pytest.fixture(scope="module")
def long_tiny(tmp_path_factory) -> Path:
    """The tiny model with 2048 positions: an agent's tools block alone is ~560 characters."""
    from rlvr.training.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("agents") / "model", max_positions=2048)


def _fit(model: Path, out: Path, *extra: str) -> list[dict]:
    cfg = load_config(
        None, [f"model.name_or_path={model}", f"train.output_dir={out}", *COMMON, *extra]
    )
    summary = Trainer(cfg).fit()
    run_dir = Path(summary["run_dir"])
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()], run_dir


def test_an_openai_client_agent_trains_two_steps(long_tiny, tmp_path):
    lines, run_dir = _fit(long_tiny, tmp_path, "env.name=agent:user_agents:three_turn_agent")
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["turns_mean"] == 3.0 and m["env_failure_rate"] == 0.0
        assert m["agent_splits"] == 0.0
        assert m["episode_env_tokens_mean"] > 0  # the prompts' follow-ups, masked
        # the trainer's log-probs of the sampled tokens, in the context the sequence holds,
        # equal the engine's: the sequence is what the model saw when it sampled them
        assert m["logprob_diff_max"] < 1e-3
        assert m["grad_norm"] > 0
    samples = [json.loads(x) for x in samples_path(run_dir, 1).read_text().splitlines()]
    assert len(samples) == 6  # one record per episode


def test_a_history_rewriting_agent_trains_on_split_sequences(long_tiny, tmp_path):
    lines, _ = _fit(long_tiny, tmp_path, "env.name=agent:user_agents:rewriting_agent")
    for m in lines:
        # every one of the 6 episodes split once: 12 sequences, reward metrics per episode
        assert m["agent_splits"] == 6.0
        assert m["turns_mean"] == 3.0
        assert m["logprob_diff_max"] < 1e-3


def test_a_verifiers_tool_environment_trains_two_steps(long_tiny, tmp_path):
    pytest.importorskip("verifiers")
    lines, run_dir = _fit(
        long_tiny, tmp_path, "env.name=verifiers:user_verifiers_env", "env.kwargs.max_turns=2"
    )
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["env_failure_rate"] == 0.0
        assert 1.0 <= m["turns_mean"] <= 2.0
        assert m["logprob_diff_max"] < 1e-3
        assert 0.0 <= m["reward_mean"] <= 2.0  # the rubric's reward
    samples = [json.loads(x) for x in samples_path(run_dir, 1).read_text().splitlines()]
    # the rows are the environment's dataset: "What is i + (i+1)?"
    assert all("What is" in s["prompt"] for s in samples)


def test_a_verifiers_single_turn_environment_trains(long_tiny, tmp_path):
    pytest.importorskip("verifiers")
    lines, _ = _fit(
        long_tiny,
        tmp_path,
        "env.name=verifiers:user_verifiers_env",
        "env.kwargs.kind=single",
        "train.max_steps=1",
    )
    assert lines[0]["turns_mean"] == 1.0 and lines[0]["env_failure_rate"] == 0.0


def test_agents_refuse_a_per_token_objective(long_tiny, tmp_path):
    cfg = load_config(
        None,
        [
            f"model.name_or_path={long_tiny}",
            f"train.output_dir={tmp_path}",
            *COMMON,
            "env.name=agent:user_agents:three_turn_agent",
            "algo.objective=ppo",
        ],
    )
    with pytest.raises(ConfigError, match="algo.objective=ppo with env.name=agent"):
        Trainer(cfg)


def test_two_ranks_each_serve_their_own_episodes(long_tiny, tmp_path):
    args = [
        f"model.name_or_path={long_tiny}",
        f"train.output_dir={tmp_path}",
        "train.run_name=two",
        *COMMON,
        "algo.prompts_per_step=4",
        "env.name=agent:user_agents:rewriting_agent",
        "train.parallel=ddp",
        "model.autocast=off",
        "train.threads=1",
    ]
    run(TORCHRUN, args, tmp_path)
    lines = steps(tmp_path / "two")
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        # 4 prompts x 3 episodes over both ranks, each split once, all played
        assert m["agent_splits"] == 12.0 and m["env_failure_rate"] == 0.0
        assert m["logprob_diff_max"] < 1e-3
