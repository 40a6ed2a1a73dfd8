"""Multi-turn episodes on the vLLM engine: one request per turn with the episode's ids as the
prompt, the model's tokens kept as sampled, the environment's tokens rendered once and masked,
and the engine's log-prob of every model token equal to the trainer's at that position.

- in this process, on the session's float32 engine (run_episodes itself);
- `rlvr train rollout.engine=vllm env.name=...` in a child process, as a user runs it (the
  config checks, the engine's context sized for a whole episode, the step's metrics).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from vllm_support import LOGPROB_TOL, base_model, trained_copy, trainer_logprobs

from rlvr.envs.turns import TurnRenderer
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.episodes import EpisodeLimits, run_episodes

pytestmark = pytest.mark.vllm


class Twice:
    """Answers the model's first turn with "ok" and ends the episode after its second."""

    def __init__(self) -> None:
        self.turns = 0

    def reset(self, row: dict) -> str:
        return row["prompt"]

    def step(self, model_text: str):
        self.turns += 1
        return (None, 1.0, True) if self.turns == 2 else ("ok", None, False)


def test_vllm_episodes_keep_the_sampled_tokens_and_their_logprobs(holder, tok):
    engine = holder.get()
    assert engine.dtype == torch.float32
    # a model that says "xyz" then EOS: every model turn ends by itself (EOS), well inside
    # max_new_tokens, so each episode plays both turns
    model = trained_copy(base_model(tok), tok)
    engine.load_weights(model.state_dict().items())
    renderer = TurnRenderer("none", tok)
    rows = [{"prompt": "q"}, {"prompt": "xy"}]
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=16, seed=5)
    limits = EpisodeLimits(
        max_turns=3, max_episode_tokens=32, timeout_s=10, max_observation_chars=99
    )
    texts, prompt_ids, groups = run_episodes(engine, renderer, Twice, rows, params, limits)

    assert texts == ["q", "xy"] and [len(g) for g in groups] == [3, 3]
    comps = [c for g in groups for c in g]
    env_turn = renderer.env_turn_ids("ok", "user", True)
    two_turns = 0
    for c in comps:
        assert c.episode.failed == "" and c.finish_reason in ("stop", "length")
        mask = torch.tensor(c.loss_mask)
        assert len(c.token_ids) == len(c.logprobs) == len(c.loss_mask)
        if c.episode.turns == 2:
            two_turns += 1
            # model turn, the environment's turn as rendered once, model turn: in that order
            first = c.loss_mask.index(0)
            assert c.token_ids[first - 1] == tok.eos_token_id
            assert c.token_ids[first : first + len(env_turn)] == env_turn
            assert c.loss_mask == [1] * first + [0] * len(env_turn) + [1] * (
                len(c.token_ids) - first - len(env_turn)
            )
        assert all(lp == 0.0 for lp, m in zip(c.logprobs, c.loss_mask, strict=True) if m == 0)
        # the engine's log-probs at the model's tokens are the trainer's over the whole episode
        trainer = trainer_logprobs(
            model, [prompt_ids[c.prompt_index]], [c.token_ids], tok.pad_token_id
        )[0]
        engine_lp = torch.tensor(c.logprobs)
        diff = (trainer - engine_lp).abs()[mask.bool()]
        assert float(diff.max()) < LOGPROB_TOL
    assert two_turns >= 4  # the multi-turn path ran (the trained model ends almost every turn)


def _train(model_dir: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "rlvr",
        "train",
        f"model.name_or_path={model_dir}",
        f"train.output_dir={out}",
        "train.run_name=vllm-episodes",
        "train.max_steps=2",
        "train.lr=1e-3",
        "train.preflight_step=0",
        "data.template=none",
        "data.max_prompt_tokens=32",
        "rollout.engine=vllm",
        "rollout.max_new_tokens=6",
        "rollout.max_episode_tokens=40",
        "rollout.max_turns=3",
        "env.name=user_envs:CountDown",
        "env.kwargs.start=2",
        "model.autocast=off",
        "algo.group_size=3",
        "algo.prompts_per_step=2",
        "algo.tis_cap=2",
        "eval.before_after=false",
        "logging.progress=false",
        *extra,
    ]
    tmp = out / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = {**__import__("os").environ, "TMPDIR": str(tmp)}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def test_rlvr_train_plays_episodes_on_vllm(vllm_model_dir, tmp_path):
    res = _train(vllm_model_dir, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "engine: vllm" in res.stdout
    lines = (tmp_path / "vllm-episodes" / "metrics.jsonl").read_text().splitlines()
    train = [m for m in map(json.loads, lines) if m.get("step", 0) > 0]
    assert [m["step"] for m in train] == [1, 2]
    for m in train:
        # CountDown(start=2): a digit ends a model turn, and the second step ends the episode;
        # most turns of the tiny model end on the 6-token limit, which ends the episode too
        assert 1.0 <= m["turns_mean"] <= 2.0
        assert m["env_failure_rate"] == 0.0
        # float32 on both sides: the engine's log-probs at the model's tokens (LOGPROB_TOL)
        assert m["logprob_diff_max"] < LOGPROB_TOL
        assert m["response_len_mean"] == pytest.approx(m["episode_model_tokens_mean"])
    # some episodes went past their first turn (measured: 1.83 turns on average at step 1)
    assert any(m["turns_mean"] > 1.0 and m["episode_env_tokens_mean"] > 0 for m in train)
