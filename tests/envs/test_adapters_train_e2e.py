"""An OpenEnv environment (openenv-core's echo template, in process and behind OpenEnv's own
server) and a reasoning-gym task
(chain_sum, scored by its own scorer) each trained for 2 steps on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.config import load_config
from rlvr.telemetry.samples import samples_path
from rlvr.training.trainer import Trainer

ECHO_ENV = "openenv:echo_env.server.echo_env_environment:EchoEnvironment"


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("form", ["in_process", "server"])
def test_openenv_echo_environment_trains(
    tiny_model_dir, tmp_path, openenv_echo, monkeypatch, request, form
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if form == "server":  # OpenEnv's own server and client, on a local port
        url = request.getfixturevalue("echo_server")
        env = ["env.name=openenv", f"env.kwargs.base_url={url}", "env.kwargs.action_field=message"]
    else:
        env = [f"env.name={ECHO_ENV}"]
    cfg = load_config(
        None,
        [
            f"model.name_or_path={tiny_model_dir}",
            f"train.output_dir={tmp_path}",
            *env,
            # a character ends a model turn (the tiny model rarely says EOS)
            "env.kwargs.stop=[a, e, i, o, u, ' ', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9']",
            "data.template=chat",
            "data.max_prompt_tokens=160",
            "rollout.max_new_tokens=12",
            "rollout.max_episode_tokens=200",
            "rollout.max_turns=2",
            "algo.prompts_per_step=2",
            "algo.group_size=3",
            "train.max_steps=2",
            "eval.before_after=false",
            "logging.progress=false",
            "logging.samples_every=1",
        ],
    )
    summary = Trainer(cfg).fit()
    run_dir = Path(summary["run_dir"])
    lines = read_metrics(run_dir)
    assert [m["step"] for m in lines] == [1, 2]
    for step, m in enumerate(lines, start=1):
        assert m["env_failure_rate"] == 0.0 and 1.0 <= m["turns_mean"] <= 2.0
        samples = [json.loads(x) for x in samples_path(run_dir, step).read_text().splitlines()]
        assert len(samples) == 6
        for s in samples:
            assert s["prompt"].count("Echo Env environment ready!") == 1  # the reset observation
            turns = s["turns"]
            assert [t["role"] for t in turns] in (["model"], ["model", "env", "model"])
            if len(turns) == 3:
                assert turns[1]["text"] == turns[0]["text"]  # the echo of the model's turn
            # the environment's reward: 0.1 per character of every model turn it was sent (a
            # turn cut by rollout.max_new_tokens ends the episode before the environment sees it)
            sent = turns if s["finish_reason"] != "length" else turns[:-1]
            chars = sum(len(t["text"]) for t in sent if t["role"] == "model")
            assert s["env_reward"] == pytest.approx(0.1 * chars, abs=1e-6)
        # the environment alone scores the episodes (gives_reward)
        mean = sum(s["env_reward"] for s in samples) / len(samples)
        assert m["reward_mean"] == pytest.approx(mean, abs=1e-5)
    assert any(s["env_reward"] > 0 for s in samples)


def test_reasoning_gym_task_trains(tiny_model_dir, tmp_path, monkeypatch):
    import reasoning_gym
    from reasoning_gym.utils import extract_answer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_config(
        None,
        [
            f"model.name_or_path={tiny_model_dir}",
            f"train.output_dir={tmp_path}",
            "data.task=reasoning_gym:chain_sum",
            "data.task_kwargs.max_terms=3",
            "data.task_kwargs.max_digits=2",
            "data.num_train=16",
            "data.num_eval=4",
            "data.template=none",
            "data.max_prompt_tokens=200",
            "rollout.max_new_tokens=12",
            "algo.prompts_per_step=2",
            "algo.group_size=3",
            "train.max_steps=2",
            "eval.before_after=false",
            "logging.progress=false",
            "logging.samples_every=1",
        ],
    )
    summary = Trainer(cfg).fit()
    run_dir = Path(summary["run_dir"])
    lines = read_metrics(run_dir)
    assert [m["step"] for m in lines] == [1, 2]
    dataset = reasoning_gym.create_dataset("chain_sum", max_terms=3, max_digits=2)
    for step, m in enumerate(lines, start=1):
        assert m["reward_failure_rate"] == 0.0
        samples = [json.loads(x) for x in samples_path(run_dir, step).read_text().splitlines()]
        assert len(samples) == 6
        for s in samples:
            assert s["prompt"].startswith("State the final answer to the following arithmetic")
            assert s["prompt"].endswith("e.g. <answer>42</answer>.")
            # graded by the task's scorer (its info keys, not the maths reward's)
            assert set(s["info"]) == {"correct", "has_answer"}
            question = s["prompt"].split("\n\n")[0]
            entry = {"question": question, "answer": s["reference"], "metadata": {}}
            expected = dataset.score_answer(extract_answer(s["response"]), entry)
            assert s["reward"] == pytest.approx(expected)
        mean = sum(s["reward"] for s in samples) / len(samples)
        assert m["reward_mean"] == pytest.approx(mean, abs=1e-6)
