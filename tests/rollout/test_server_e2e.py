"""rollout.mode=server on this CPU: one trainer (this process) and one rollout worker (`rlvr
rollout-server`, vLLM's OpenAI-compatible server in a child process), a tiny float32 model.

- staleness 0: 3 steps; the completions and the final weights equal those of the same run with
  vLLM in the trainer's process sampling with the same per-prompt seeds.
- staleness 1: 3 steps; staleness 0 then 1, 1, every completion labelled by the server with the
  version that sampled it; a trainer restarted from the step-2 checkpoint reconnects to the same
  worker and ends like the uninterrupted run.
- staleness 2: 5 steps with a planted slow trainer; staleness 0, 1, 2, 2, 2 by the server's labels.
- a trainer SIGKILLed mid-run is resumed (`rlvr train --resume`) against the same worker.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from vllm_support import TINY, rollout_server

from rlvr.cli.main import main as cli_main
from rlvr.config import load_config
from rlvr.rollout.server import request_seeds, sampling_body
from rlvr.training.trainer import Trainer

pytestmark = pytest.mark.vllm

RUN = [
    "data.template=none",
    "data.max_prompt_tokens=32",
    "rollout.max_new_tokens=8",
    "eval.max_new_tokens=8",
    "eval.before_after=false",
    "logging.progress=false",
    "reward.specs=[{name: 'toy_rewards:digit_fraction'}]",
    "model.autocast=off",
    "algo.prompts_per_step=2",
    "algo.group_size=4",
    "algo.tis_cap=2",
    "train.lr=3e-3",
    "train.max_steps=3",
    "train.threads=1",
    "rollout.engine=vllm",
]


# The worker serves the config a run gives it; with env.name its context is sized for episodes.
EPISODE_CONTEXT = ["env.name=guess_number", "rollout.max_episode_tokens=40"]
EPISODES = ["env.name=user_envs:CountDown", "env.kwargs.start=2", "rollout.max_episode_tokens=40"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from rlvr.training.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("srv") / "model", **TINY)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    """`rlvr rollout-server` for the tiny model; the worker's context holds a whole episode
    (max_model_len_for), for the episodes test."""
    log = tmp_path_factory.mktemp("srv_log") / "server.log"
    with rollout_server(model_dir, [*RUN, *EPISODE_CONTEXT], log) as url:
        yield url


def _config(model_dir, out, *extra):
    return load_config(
        None, [f"model.name_or_path={model_dir}", f"train.output_dir={out}", *RUN, *extra]
    )


def _lines(run_dir: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [m for m in lines if m["step"] > 0]


def _samples(run_dir: Path) -> list:
    return [
        [(r["response"], r["tokens"]) for r in map(json.loads, p.read_text().splitlines())]
        for p in sorted((run_dir / "samples").glob("*.jsonl"))
    ]


class SeededInProcess:
    """The in-process vLLM engine sampling each prompt with the server client's seed
    (`request_seeds`, `sampling_body`): the in-process engine itself seeds one generator per
    batch, so without this the two runs would draw different samples."""

    @staticmethod
    def patch(engine) -> None:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        from rlvr.rollout.vllm_setup import completion_from_vllm

        def generate(prompt_ids, params):
            seeds = request_seeds(params, len(prompt_ids))
            outs = engine._llm.generate(
                [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids],
                [VSamplingParams(**sampling_body(params, s)) for s in seeds],
                use_tqdm=False,
            )
            return [
                [completion_from_vllm(i, o) for o in sorted(r.outputs, key=lambda o: o.index)]
                for i, r in enumerate(outs)
            ]

        engine.generate = generate


def test_staleness_0_matches_the_in_process_engine(model_dir, server, tmp_path):
    torch.manual_seed(0)
    remote = Trainer(
        _config(
            model_dir,
            tmp_path / "server",
            "rollout.mode=server",
            f"rollout.server_url={server}",
            "logging.samples_every=1",
        )
    )
    remote.fit()
    torch.manual_seed(0)
    local = Trainer(_config(model_dir, tmp_path / "local", "logging.samples_every=1"))
    SeededInProcess.patch(local.engine)
    local.fit()

    a, b = _lines(remote.run.run_dir), _lines(local.run.run_dir)
    assert [m["staleness_max"] for m in a] == [0.0, 0.0, 0.0]
    assert _samples(remote.run.run_dir) == _samples(local.run.run_dir)  # the same completions
    for x, y in zip(a, b, strict=True):
        assert x["reward_mean"] == y["reward_mean"]
        # both engines compute in float32: log-probs within 2e-6 of the trainer's (vllm_support)
        assert x["logprob_diff_max"] < 1e-4 and y["logprob_diff_max"] < 1e-4
    assert a[0]["sync_bytes"] > 0  # every step pushed the weights over the gloo group
    # The completions are equal, so the losses differ only through the engine log-probs in the
    # TIS weights (< 1e-4 apart, and capped weights ~1 here): gradients agree to ~1e-4 relative,
    # and three AdamW steps of lr 3e-3 move a weight by at most ~1e-2, so 1e-5 absolute bounds
    # the difference with room (a missed or wrong sync moves weights by ~1e-3). Measured: 0.0,
    # the two engines' log-probs were identical here; the margin is for a server that batches
    # the concurrent requests differently.
    wa, wb = remote.model.state_dict(), local.model.state_dict()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=0, atol=1e-5, msg=name)


def test_episodes_through_the_server_match_the_in_process_engine(model_dir, server, tmp_path):
    """One request per turn, the episode so far as the prompt: the server plays the same
    episodes (same tokens, same environment turns) as the in-process engine with the same
    per-request seeds, and its log-probs at the model's tokens are the trainer's."""
    common = (*EPISODES, "logging.samples_every=1", "train.max_steps=2")
    torch.manual_seed(0)
    remote = Trainer(
        _config(
            model_dir,
            tmp_path / "server",
            "rollout.mode=server",
            f"rollout.server_url={server}",
            *common,
        )
    )
    remote.fit()
    torch.manual_seed(0)
    local = Trainer(_config(model_dir, tmp_path / "local", *common))
    SeededInProcess.patch(local.engine)
    local.fit()

    a, b = _lines(remote.run.run_dir), _lines(local.run.run_dir)
    assert _samples(remote.run.run_dir) == _samples(local.run.run_dir)
    for x, y in zip(a, b, strict=True):
        assert x["env_failure_rate"] == 0.0 and x["staleness_max"] == 0.0
        for key in ("turns_mean", "episode_env_tokens_mean", "reward_mean"):
            assert x[key] == y[key], key
        assert x["logprob_diff_max"] < 1e-4
    assert any(m["turns_mean"] > 1.0 for m in a)  # episodes went past their first turn
    turns = _turns(remote.run.run_dir)
    assert turns == _turns(local.run.run_dir)  # turn by turn, model and environment alike
    assert any("env" in [t["role"] for t in ep] for ep in turns)


def _turns(run_dir: Path) -> list[list[dict]]:
    return [
        r["turns"]
        for p in sorted((run_dir / "samples").glob("*.jsonl"))
        for r in map(json.loads, p.read_text().splitlines())
    ]


def _slow_updates(monkeypatch, seconds: float = 2.0) -> None:
    """Each update takes ``seconds`` more, so the worker starts the next batch before the
    update's push asks for the engine: a push waiting for the gate goes before a generation
    still queued (training/overlap.py), so on a loaded machine (a CI run beside another rlvr
    run) the worker's thread could start late and the batch come out fresher than k allows."""
    import time

    import rlvr.training.step as step_mod

    real = step_mod.update

    def slow(*args):
        time.sleep(seconds)
        return real(*args)

    monkeypatch.setattr(step_mod, "update", slow)


def test_staleness_1_labels_versions_and_a_restarted_trainer_reconnects(
    model_dir, server, tmp_path, monkeypatch
):
    _slow_updates(monkeypatch)  # step 3's batch read 0 behind under a CI run's load
    extra = ("rollout.mode=server", f"rollout.server_url={server}", "rollout.max_staleness=1")
    torch.manual_seed(0)
    full = Trainer(_config(model_dir, tmp_path / "full", *extra, "train.save_every=1"))
    full.fit()
    lines = _lines(full.run.run_dir)
    assert [m["staleness_max"] for m in lines] == [0.0, 1.0, 1.0]
    assert [m["staleness_mean"] for m in lines] == [0.0, 1.0, 1.0]
    assert lines[0]["logprob_diff_max"] < 1e-4  # on-policy
    assert all(m["logprob_diff_max"] > 1e-3 for m in lines[1:])  # one version behind
    assert all(m["tis_weight_mean"] != 1.0 for m in lines[1:])  # the correction acts
    assert {c.policy_version for c in full.last_batch.completions} == {1}  # the server's label

    part = tmp_path / "part"
    shutil.copytree(full.run.run_dir, part)
    shutil.rmtree(part / "checkpoints" / "step_000003")
    shutil.rmtree(part / "final")
    resumed = Trainer(load_config(part / "config.yaml", [f"train.resume={part}"]))
    resumed.fit()  # a new trainer joins the same worker's weight group and pushes step 2
    again = _lines(part)
    keys = ("reward_mean", "staleness_max", "response_len_mean")
    assert [[m[k] for k in keys] for m in again] == [[m[k] for k in keys] for m in lines]
    wa, wb = full.model.state_dict(), resumed.model.state_dict()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=0, atol=1e-6, msg=name)


def test_staleness_2_keeps_every_batch_within_two_versions(
    model_dir, server, tmp_path, monkeypatch
):
    """rollout.max_staleness=2 against the worker, the trainer slowed by a planted 2 s per
    update so that the worker runs ahead: the batches of the next two steps are generated on the
    worker during each update, the server labels every completion, and the lag reads 0, 1, then
    2 (the most the pipeline allows: the batch of step s+2 is requested during step s), never
    more; nothing is dropped since every update is pushed."""
    _slow_updates(monkeypatch)
    extra = ("rollout.mode=server", f"rollout.server_url={server}", "rollout.max_staleness=2")
    trainer = Trainer(_config(model_dir, tmp_path / "k2", *extra, "train.max_steps=5"))
    trainer.fit()
    lines = _lines(trainer.run.run_dir)
    assert [m["staleness_max"] for m in lines] == [0.0, 1.0, 2.0, 2.0, 2.0]
    assert [m["staleness_mean"] for m in lines] == [0.0, 1.0, 2.0, 2.0, 2.0]
    assert [m["stale_dropped"] for m in lines] == [0.0] * 5
    assert all(m["logprob_diff_max"] > 1e-3 for m in lines[1:])  # truly older weights
    assert {c.policy_version for c in trainer.last_batch.completions} == {2}  # the server's label


def test_the_worker_survives_a_killed_trainer(model_dir, server, tmp_path):
    """A trainer SIGKILLed after its step-1 checkpoint leaves the worker holding a dead weight
    group; `rlvr train --resume` joins the same worker again and finishes the run."""
    import time

    run_dir = tmp_path / "killed"
    cmd = [sys.executable, "-m", "rlvr", "train", f"model.name_or_path={model_dir}"]
    cmd += [f"train.output_dir={tmp_path}", "train.run_name=killed", *RUN]
    cmd += ["rollout.mode=server", f"rollout.server_url={server}", "train.save_every=1"]
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = run_dir / "checkpoints" / "step_000001" / "COMPLETE"
    deadline = time.monotonic() + 300
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert marker.exists()
    assert cli_main(["train", "--resume", str(run_dir)]) == 0
    steps = [m["step"] for m in _lines(run_dir)]
    assert steps[-1] == 3 and sorted(set(steps)) == [1, 2, 3]
    assert (run_dir / "final").is_dir()


def test_a_request_without_the_token_is_refused_and_changes_nothing(model_dir, server):
    """Every request but GET /health needs the server's token (X-Rlvr-Token): without it, or with
    a wrong one, a weight-version label, a weight-sync join through /collective_rpc, a pause and a
    generation are refused with 401, and the engine is as it was (its weight version, and its
    replies to the same seeded request). Before, each of them went through: the version label,
    for one, became 999."""
    from rlvr.rollout.server_auth import TOKEN_ENV
    from rlvr.rollout.server_launch import http_get, http_post

    token = os.environ[TOKEN_ENV]
    ask = {
        "token_ids": [5, 6, 7],
        "sampling_params": {"n": 2, "max_tokens": 6, "temperature": 1.0, "seed": 11},
        "output_mode": "text",
    }
    replies = http_post(server, "/inference/v1/generate", ask, timeout_s=120, token=token)
    version = http_get(server, "/weight_info", token=token)
    refused = [
        ("/update_weight_version", {"new_version": "999"}),
        ("/collective_rpc", {"method": "rlvr_join", "args": ["127.0.0.1", "9", "2", "1", "gloo"]}),
        ("/pause", {}),
        ("/inference/v1/generate", ask),
    ]
    for path, body in refused:
        for wrong in (None, "not-the-token"):
            with pytest.raises(RuntimeError, match="HTTP 401"):
                http_post(server, path, body, timeout_s=60, token=wrong)
    with pytest.raises(RuntimeError, match="HTTP 401"):
        http_get(server, "/weight_info")
    http_get(server, "/health")  # the start-up check stays open
    assert http_get(server, "/weight_info", token=token) == version
    again = http_post(server, "/inference/v1/generate", ask, timeout_s=120, token=token)
    texts = lambda r: [(c["token_ids"], c["text"]) for c in r["choices"]]  # noqa: E731
    assert texts(again) == texts(replies)
