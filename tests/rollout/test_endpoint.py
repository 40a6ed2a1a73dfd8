"""The OpenAI-compatible endpoint (rlvr.rollout.endpoint) driven by the real `openai` client over
the hf engine: the ids an episode trains on are the ids the engine sampled, a rewritten history
splits the episode, a hanging agent is contained, and requests from a group are batched."""

from __future__ import annotations

import json
import time

import pytest
import torch

from rlvr.rollout.agents import AgentRunner, FunctionPlayer, expand_sequences
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.chat_format import ChatFormat, normalize_messages, normalize_tools
from rlvr.rollout.endpoint import Endpoint, EndpointLimits
from rlvr.rollout.hf import HFEngine

openai = pytest.importorskip("openai")

# the tool call the fixture model learned to write: compact JSON, unlike the template's own
# rendering of the call (json.dumps with spaces), so the follow-up must keep the sampled ids
CALL = '<tool_call>{"name":"add","arguments":{"a":2,"b":3}}</tool_call>'
LIMITS = EndpointLimits(
    max_new_tokens=80, max_sequence_tokens=600, max_prompt_tokens=1500, max_calls=4
)


class Recording:
    """The hf engine, with every generate call's prompts and sampled completions kept."""

    def __init__(self, engine) -> None:
        self.engine, self.calls = engine, []
        self.policy_version = 0

    def generate(self, prompt_ids, params, vision=None):
        out = self.engine.generate(prompt_ids, params)
        self.calls.append(([list(p) for p in prompt_ids], out))
        return out


@pytest.fixture(scope="module")
def tool_model():
    """A tiny real transformers model whose every reply is ``CALL`` (one added token of the char
    tokenizer): its layers add nothing to the residual stream, the final norm keeps one
    dimension, which every embedding holds at +10, and the head scores only ``CALL`` on it. The
    engine samples it with a log-prob of ~0; a request's stop ``</tool_call>`` ends the turn."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlvr.training.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.add_tokens([CALL])
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 10.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[tok.convert_tokens_to_ids(CALL), 0] = 10.0
    return tok, model


def _tools():
    from user_agents import TOOLS

    return TOOLS


def _endpoint(tok, model, **params):
    engine = Recording(HFEngine(model, tok, batch_size=16))
    p = SamplingParams(**{"temperature": 0.0, "max_new_tokens": 80, **params})
    return engine, Endpoint(engine, tok, p, LIMITS)


def _sampled(engine: Recording) -> dict[tuple, list]:
    """Each sampled completion by its prompt ids."""
    out = {}
    for prompts, comps in engine.calls:
        for p, group in zip(prompts, comps, strict=True):
            out[tuple(p)] = group[0]
    return out


def test_three_turn_tool_agent_trains_on_exactly_the_ids_it_sampled(tool_model):
    from user_agents import three_turn_agent

    tok, model = tool_model
    engine, ep = _endpoint(tok, model)
    try:
        url, log = ep.open()
        three_turn_agent(url, {"prompt": "What is 2+3?", "answer": "5"})
        log = ep.finish(log.key)
    finally:
        ep.close()
    assert log.calls == 3 and log.tool_calls == 3  # the model called the tool every turn
    assert log.splits == 0 and len(log.sequences) == 1  # one sequence: the history was kept
    seq = log.sequences[0]
    sampled = _sampled(engine)
    # replay the calls: each call's prompt is the sequence so far, its reply the sampled ids
    model_ids, model_lps, pos = [], [], 0
    full = seq.prompt + seq.ids
    for turn in range(3):
        run = [i for i, m in enumerate(seq.mask) if m][pos:]
        start = run[0]
        end = start
        while end < len(seq.mask) and seq.mask[end]:
            end += 1
        comp = sampled[tuple(full[: len(seq.prompt) + start])]
        assert seq.ids[start:end] == comp.token_ids, turn
        assert seq.logprobs[start:end] == comp.logprobs, turn
        model_ids += comp.token_ids
        model_lps += comp.logprobs
        pos += end - start
    assert [t for t, m in zip(seq.ids, seq.mask, strict=True) if m] == model_ids
    assert all(lp == 0.0 for lp, m in zip(seq.logprobs, seq.mask, strict=True) if not m)
    # the model wrote compact JSON; the template would write the call with spaces: the sequence
    # keeps the model's text, never re-rendered
    text = tok.decode(full)
    assert text.count(CALL) == 3
    fmt = ChatFormat(tok)
    tools = normalize_tools(_tools())
    msgs = [{"role": "user", "content": "What is 2+3?"}]
    for turn in range(3):
        call = {"id": "c", "type": "function", "function": {"name": "add", "arguments": "{}"}}
        call["function"]["arguments"] = json.dumps({"a": 2, "b": 3})
        msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        if turn < 2:
            msgs.append({"role": "tool", "tool_call_id": "c", "content": "5"})
    rendered = fmt.render(normalize_messages(msgs), tools, generation_prompt=False)
    assert CALL not in rendered  # the template's own rendering differs from what was sampled
    # apart from the calls, the sequence is the template's text of the whole conversation
    spaced = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    assert text.replace(CALL, spaced) + fmt.closing == rendered


def test_a_rewritten_history_splits_the_episode(tool_model):
    from user_agents import rewriting_agent

    tok, model = tool_model
    engine, ep = _endpoint(tok, model, temperature=1.0, seed=5)
    try:
        url, log = ep.open()
        rewriting_agent(url, {"prompt": "Hi", "answer": "0"})
        log = ep.finish(log.key)
    finally:
        ep.close()
    assert log.calls == 3 and log.splits == 1 and [s.calls for s in log.sequences] == [2, 1]
    sampled = _sampled(engine)
    first, second = log.sequences
    # the second sequence starts from the prompt of the rewritten history, as rendered
    fmt = ChatFormat(tok)
    assert tuple(second.prompt) in sampled
    assert second.ids == sampled[tuple(second.prompt)].token_ids and all(second.mask)
    assert tok.decode(second.prompt).startswith(
        fmt.render(
            normalize_messages([{"role": "user", "content": "Hi"}]), [], generation_prompt=False
        )
    )
    # each sequence trains on what the model saw: the first holds the first two calls
    model_ids = [t for t, m in zip(first.ids, first.mask, strict=True) if m]
    replies = [sampled[tuple(first.prompt)].token_ids]
    cut = len(first.prompt) + len(replies[0])
    later = [p for p in sampled if len(p) > cut and list(p[: len(first.prompt)]) == first.prompt]
    replies.append(sampled[later[0]].token_ids)
    assert model_ids == replies[0] + replies[1]


def test_requests_of_a_group_are_batched_into_one_generate_call(tool_model):
    from user_agents import three_turn_agent

    tok, model = tool_model
    player = FunctionPlayer("agent:user_agents:three_turn_agent", {})
    # a long window: a turn's generate call waits until all 4 agents asked, however slow the
    # machine starts their threads
    runner = AgentRunner(player, tok, LIMITS, 60, window_s=10.0)
    engine = Recording(HFEngine(model, tok, batch_size=16))
    try:
        texts, ids, groups = runner.run(
            engine, [{"prompt": "What is 2+3?", "answer": "5"}], SamplingParams(n=4, seed=1)
        )
    finally:
        runner.close()
    assert three_turn_agent  # the agent the runner plays
    assert len(groups[0]) == 4 and all(c.episode.turns == 3 for c in groups[0])
    # 4 agents x 3 turns in lockstep: each turn's 4 requests in one generate call
    assert [len(p) for p, _ in engine.calls] == [4, 4, 4]
    for c in groups[0]:
        assert c.prompt_ids == ids[0] and not c.episode.failed
        assert sum(c.loss_mask) == c.episode.model_tokens > 0


def test_a_hanging_agent_fails_only_its_own_episode(tool_model):
    tok, model = tool_model
    runner = AgentRunner(FunctionPlayer("agent:user_agents:sometimes_hangs", {}), tok, LIMITS, 3.0)
    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}]
    t = time.monotonic()
    try:
        _, _, groups = runner.run(HFEngine(model, tok), rows, SamplingParams(n=2, seed=0))
    finally:
        runner.close()
    assert time.monotonic() - t < 30
    assert [c.episode.failed == "" for c in groups[0]] == [True, True]
    assert all("timed out after 3.0 s" in c.episode.failed for c in groups[1])
    assert all(c.episode.env_reward is not None for c in groups[0])


def test_expand_sequences_lays_out_earlier_sequences_before_their_episode():
    from rlvr.rollout.base import Completion, EpisodeInfo

    def comp(tag, earlier=()):
        info = EpisodeInfo(splits=len(earlier))
        c = Completion(0, [tag], [0.0], str(tag), "stop", episode=info, prompt_ids=[9])
        info.earlier = [Completion(0, [t], [0.0], str(t), "stop", prompt_ids=[8]) for t in earlier]
        return c

    groups = [[comp(1, (10, 11)), comp(2)], [comp(3), comp(4, (12,))]]
    out, of = expand_sequences(groups)
    assert [[c.token_ids[0] if c.token_ids else None for c in g] for g in out] == [
        [10, 11, 1, 2],
        [3, 12, 4, None],
    ]
    assert of == [2, 2, 2, 3, 4, 6, 6, -1]
    same, none = expand_sequences([[comp(1), comp(2)]])
    assert none is None and same[0][0].token_ids == [1]


def test_many_agents_connecting_at_once_are_all_served(tiny_tokenizer):
    """A step's agents open their connections together (32 in recipes/calc_agent.yaml): the
    listen backlog must hold them all (the standard library's default of 5 dropped most)."""
    import http.client
    import threading

    ep = Endpoint(None, tiny_tokenizer, SamplingParams(), LIMITS)
    _, log = ep.open()
    errors, go = [], threading.Barrier(200)

    def hit():
        go.wait()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", ep.port, timeout=20)
            conn.request("GET", f"/episodes/{log.key}/v1/models")
            resp = conn.getresponse()
            assert resp.status == 200 and b"rlvr-policy" in resp.read()
        except Exception as exc:  # noqa: BLE001 - counted
            errors.append(repr(exc))

    threads = [threading.Thread(target=hit) for _ in range(200)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        ep.close()
    assert errors == []


class Busy:
    """The hf engine, counting the generate calls under way and when each started and ended."""

    def __init__(self, engine) -> None:
        self.engine, self.running, self.spans = engine, 0, []
        self.policy_version = 0

    def generate(self, prompt_ids, params, vision=None):
        start = time.monotonic()
        self.running += 1
        try:
            return self.engine.generate(prompt_ids, params)
        finally:
            self.running -= 1
            self.spans.append((start, time.monotonic()))


def test_no_generation_outlives_the_agents_step(tool_model):
    """An agent timed out while its request is in the engine: the trainer's next phases (the
    update, a checkpoint) use the model the hf engine decodes with, so ``run`` must not return
    while a generate call is under way (the hf engine swaps the model's linear layers for packed
    copies while it decodes: a forward then gets no gradient, a state dict other names), and a
    request of an ended episode still queued must never reach the engine."""
    from rlvr.rollout.packed_linears import PackedLinear

    tok, model = tool_model
    slow = {"left": 1}

    def hold(module, args):  # the first forward of the first generate call takes 3 s
        if slow["left"]:
            slow["left"] -= 1
            time.sleep(3.0)

    handle = model.register_forward_pre_hook(hold)
    engine = Busy(HFEngine(model, tok))
    runner = AgentRunner(FunctionPlayer("agent:user_agents:delayed_call", {}), tok, LIMITS, 1.0)
    # the first episode's request is in the engine at the timeout, the second's waits behind it
    rows = [
        {"prompt": "a", "answer": "1", "delay": 0},
        {"prompt": "b", "answer": "1", "delay": 0.5},
    ]
    try:
        _, _, groups = runner.run(engine, rows, SamplingParams(n=1, seed=0))
        returned = time.monotonic()
        packed = [n for n, m in model.named_modules() if isinstance(m, PackedLinear)]
        running = engine.running
        time.sleep(4.0)  # what the endpoint does after run() returned
    finally:
        handle.remove()
        runner.close()
    assert (running, len(packed)) == (0, 0)
    assert all(start < returned for start, _ in engine.spans)
    assert len(engine.spans) == 1  # the ended episode's queued request was dropped
    assert all("timed out after 1.0 s" in g[0].episode.failed for g in groups)


def test_a_stop_signal_in_the_agents_step_leaves_no_generation_under_way(tool_model):
    """A stop signal raises in the main thread while the agents play (the trainer's handler
    abandons the rollout, then writes a checkpoint of the model): the exception leaves ``run``
    only once the engine's call under way has ended (the model's own linear layers back)."""
    import os
    import signal
    import threading

    from rlvr.rollout.packed_linears import PackedLinear

    class Stop(BaseException):
        pass

    def raise_stop(signum, frame):
        raise Stop

    tok, model = tool_model
    slow = {"left": 1}

    def hold(module, args):
        if slow["left"]:
            slow["left"] -= 1
            time.sleep(3.0)

    handle = model.register_forward_pre_hook(hold)
    engine = Busy(HFEngine(model, tok))
    runner = AgentRunner(FunctionPlayer("agent:user_agents:delayed_call", {}), tok, LIMITS, 60.0)
    previous = signal.signal(signal.SIGUSR2, raise_stop)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGUSR2))
    timer.start()
    try:
        with pytest.raises(Stop):
            runner.run(engine, [{"prompt": "a", "answer": "1"}], SamplingParams(n=1, seed=0))
        packed = [n for n, m in model.named_modules() if isinstance(m, PackedLinear)]
        running = engine.running
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR2, previous)
        handle.remove()
        runner.close()
    assert (running, len(packed)) == (0, 0)
