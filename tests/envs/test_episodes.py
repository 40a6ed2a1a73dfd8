"""Episodes token in, token out: loss masks and log-probs by hand on a two-turn episode, the
real hf engine's log-probs aligned with the trainer's at the model's tokens, and environments
that raise, hang, flood or break the protocol failing only their own episode."""

from __future__ import annotations

import string
import time

import pytest
import torch

from rlvr.envs.turns import TurnRenderer
from rlvr.objectives.batch import RolloutBatch
from rlvr.rollout.base import Completion, SamplingParams
from rlvr.rollout.episodes import EnvFailureError, EpisodeLimits, check_env_failures, run_episodes
from rlvr.training.step_metrics import episode_metrics

LIMITS = EpisodeLimits(max_turns=3, max_episode_tokens=200, timeout_s=2.0, max_observation_chars=50)


class ScriptedEngine:
    """Replies from a script: turn k's reply to every prompt is ``replies[k]`` (char tokens),
    log-prob of token j = -(j + 1) / 10. Records the prompts it was given."""

    def __init__(self, tokenizer, replies: list[str]):
        self.tok, self.replies, self.prompts, self.turn = tokenizer, replies, [], 0

    def generate(self, prompt_ids, params):
        self.prompts.append([list(p) for p in prompt_ids])
        text = self.replies[self.turn]
        self.turn += 1
        ids = self.tok(text, add_special_tokens=False).input_ids + [self.tok.eos_token_id]
        ids = ids[: params.max_new_tokens]
        lps = [-(j + 1) / 10 for j in range(len(ids))]
        return [
            [Completion(i, list(ids), list(lps), text, "stop") for _ in range(params.n)]
            for i in range(len(prompt_ids))
        ]


class Echo:
    """Answers 'ok' to the first turn, done after the second with reward 1."""

    def reset(self, row):
        self.turns = 0
        return row["prompt"]

    def step(self, text):
        self.turns += 1
        return ("ok", None, False) if self.turns == 1 else (None, 1.0, True)


def test_two_turn_episode_ids_masks_and_logprobs_by_hand(tiny_tokenizer):
    tok = tiny_tokenizer
    renderer = TurnRenderer("chat", tok)
    engine = ScriptedEngine(tok, ["ab", "c"])
    params = SamplingParams(n=2, max_new_tokens=8)
    texts, prompts, groups = run_episodes(engine, renderer, Echo, [{"prompt": "q"}], params, LIMITS)
    enc = lambda s: tok(s, add_special_tokens=False).input_ids  # noqa: E731
    eos = tok.eos_token_id
    assert texts == ["<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"]
    assert prompts == [enc(texts[0])]
    env = enc("\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n")  # after the model's EOS
    assert len(groups[0]) == 2
    for c in groups[0]:
        assert c.token_ids == enc("ab") + [eos] + env + enc("c") + [eos]
        assert c.loss_mask == [1, 1, 1] + [0] * len(env) + [1, 1]
        assert c.logprobs == [-0.1, -0.2, -0.3] + [0.0] * len(env) + [-0.1, -0.2]
        assert c.finish_reason == "stop" and c.model_token_count == 5
        ep = c.episode
        assert (ep.turns, ep.env_reward, ep.failed, ep.final_text) == (2, 1.0, "", "c")
        assert (ep.model_tokens, ep.env_tokens) == (5, len(env))
        assert ep.transcript == [("model", "ab"), ("env", "ok"), ("model", "c")]
    # the second turn's prompt is the episode so far, ids as they were: nothing re-encoded
    assert engine.prompts[1] == [prompts[0] + enc("ab") + [eos] + env] * 2
    batch = RolloutBatch([{"prompt": "q", "answer": ""}], texts, prompts, groups, 2)
    mask = batch.token_mask()
    assert mask[0].tolist() == [1.0, 1.0, 1.0] + [0.0] * len(env) + [1.0, 1.0]
    assert batch.loss_mask_rows([1], mask.shape[1]).tolist() == mask[1:].tolist()
    assert batch.model_tokens(0) == 5


def test_engine_logprobs_align_with_the_trainers_at_model_tokens(tiny_model_dir, tiny_tokenizer):
    """The real hf engine over a tiny model: the trainer's forward over prompt + episode gives,
    at every model token, the log-prob the engine sampled it with."""
    from transformers import AutoModelForCausalLM

    from rlvr.model.forward import build_sequence_batch
    from rlvr.model.logprobs import completion_logprobs
    from rlvr.rollout.hf import HFEngine

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).float()
    engine = HFEngine(model, tiny_tokenizer)
    renderer = TurnRenderer("chat", tiny_tokenizer)
    params = SamplingParams(n=3, max_new_tokens=30, seed=1)
    rows = [{"prompt": "1+1"}, {"prompt": "2+2"}]
    _, prompts, groups = run_episodes(engine, renderer, Chatty, rows, params, LIMITS)
    comps = [c for g in groups for c in g]
    assert all(c.episode.turns >= 2 for c in comps)
    sb = build_sequence_batch(
        [prompts[i // 3] for i in range(6)],
        [c.token_ids for c in comps],
        tiny_tokenizer.pad_token_id,
    )
    with torch.no_grad():
        out = model(
            input_ids=sb.input_ids, attention_mask=sb.attention_mask, position_ids=sb.position_ids
        )
    logits = out.logits[:, sb.prompt_len - 1 : -1]
    lp, _ = completion_logprobs(logits, sb, 1.0, entropy=False)
    for row, c in enumerate(comps):
        mask = torch.tensor(c.loss_mask, dtype=torch.bool)
        assert 0 < int(mask.sum()) < len(c.token_ids)  # model and environment tokens both
        trainer = lp[row, : len(c.token_ids)][mask]
        engine_lp = torch.tensor(c.logprobs)[mask]
        torch.testing.assert_close(trainer, engine_lp, atol=2e-4, rtol=0)
        assert torch.tensor(c.logprobs)[~mask].eq(0).all()


class Chatty:
    """Always answers, never done: episodes run to rollout.max_turns. A letter ends a model
    turn (a stop string), so a random tiny model's turns end before max_new_tokens."""

    stop = tuple(string.ascii_letters)

    def reset(self, row):
        return row["prompt"]

    def step(self, text):
        return "more", None, False


class Planted:
    """Misbehaves when the row asks: raise, hang, flood, or break the protocol."""

    def reset(self, row):
        self.kind = row["prompt"]
        return "go"

    def step(self, text):
        if self.kind == "raise":
            raise RuntimeError("planted failure")
        if self.kind == "hang":
            time.sleep(60)
        if self.kind == "flood":
            return "x" * 10_000, None, False
        if self.kind == "protocol":
            return "obs"  # not a tuple
        return None, 1.0, True


def test_a_raising_hanging_flooding_env_fails_only_its_own_episode(tiny_tokenizer):
    renderer = TurnRenderer("chat", tiny_tokenizer)
    engine = ScriptedEngine(tiny_tokenizer, ["a", "b", "c"])
    kinds = ["fine", "raise", "hang", "flood", "protocol"]
    t = time.monotonic()
    _, _, groups = run_episodes(
        engine, renderer, Planted, [{"prompt": k} for k in kinds], SamplingParams(n=2), LIMITS
    )
    took = time.monotonic() - t
    assert took < LIMITS.timeout_s + 3  # the hanging step cost its timeout, not 60 s
    failed = {k: [c.episode.failed for c in g] for k, g in zip(kinds, groups, strict=True)}
    assert failed["fine"] == ["", ""]
    assert all("planted failure" in f for f in failed["raise"])
    assert all("timed out after 2.0 s" in f for f in failed["hang"])
    assert all("env.max_observation_chars=50" in f for f in failed["flood"])
    assert all("must return (observation, reward, done)" in f for f in failed["protocol"])
    comps = [c for g in groups for c in g]
    assert [c.episode.env_reward for c in groups[0]] == [1.0, 1.0]
    m = episode_metrics(comps)
    assert m["env_failure_rate"] == pytest.approx(8 / 10)
    check_env_failures(m, comps, 0.8)  # at the limit: goes on
    with pytest.raises(EnvFailureError, match="env.max_failure_fraction=0.5"):
        check_env_failures(m, comps, 0.5)


def test_episode_scores_replace_or_keep_the_reward_specs():
    from rlvr.rollout.base import EpisodeInfo
    from rlvr.rollout.episodes import episode_scores

    def comp(**kw):
        return Completion(0, [1], [0.0], "t", "stop", loss_mask=[1], episode=EpisodeInfo(**kw))

    comps = [
        comp(env_reward=2.0),  # gave a reward, gives_reward unset: the env's
        comp(),  # gave none: the reward specs'
        comp(gives_reward=True),  # the env grades, gave none: 0
        comp(gives_reward=False, env_reward=5.0),  # the specs grade whatever it gave
        comp(failed="boom", env_reward=1.0),  # failed: invalid
        Completion(0, [1], [0.0], "t", "stop"),  # single-turn: untouched
    ]
    scores, valid = episode_scores(comps, [0.5] * 6, [True] * 5 + [False])
    assert scores == [2.0, 0.5, 0.0, 0.5, 0.0, 0.5]
    assert valid == [True, True, True, True, False, False]


def test_max_episode_tokens_and_max_turns_end_episodes(tiny_tokenizer):
    renderer = TurnRenderer("chat", tiny_tokenizer)
    short = EpisodeLimits(
        max_turns=5, max_episode_tokens=10, timeout_s=2.0, max_observation_chars=50
    )
    engine = ScriptedEngine(tiny_tokenizer, ["abcdefghijklmnop"])
    _, _, groups = run_episodes(
        engine, renderer, Chatty, [{"prompt": "q"}], SamplingParams(n=1, max_new_tokens=40), short
    )
    c = groups[0][0]
    assert len(c.token_ids) == 10 and c.finish_reason == "length" and c.truncated
    engine = ScriptedEngine(tiny_tokenizer, ["a", "b"])
    two = EpisodeLimits(
        max_turns=2, max_episode_tokens=200, timeout_s=2.0, max_observation_chars=50
    )
    _, _, groups = run_episodes(
        engine, renderer, Chatty, [{"prompt": "q"}], SamplingParams(n=1), two
    )
    c = groups[0][0]
    assert c.finish_reason == "turns" and c.episode.turns == 2
    assert (
        c.loss_mask[-1] == 1
    )  # the episode ends on the model's turn, not an unanswered observation
