"""Agents as environments: any program that talks to a chat completions API, trained through the
OpenAI-compatible endpoint (rlvr.rollout.endpoint). docs/environments.md, "Agents".

``env.name=agent:package.module:function``: ``function(base_url, row)`` plays one episode of
``row`` against ``base_url`` (give it to an OpenAI client) and returns its reward: a number, or
an object or dict with ``reward`` (and optionally ``info``). ``env.kwargs`` are passed as
keyword arguments. The group's agents (every row's ``algo.group_size`` episodes) run at once in
threads, each at most ``env.timeout_s``; an agent that raises, hangs, returns no number or made
no request fails its own episode (``env_failure_rate``, ``env.max_failure_fraction``), as an
environment does.

``env.name=verifiers:package.module``: a verifiers environment (PyPI ``verifiers``, its classic
API: ``vf.SingleTurnEnv``, ``vf.MultiTurnEnv``, ``vf.ToolEnv`` with a ``vf.Rubric``), built by
the module's ``load_environment(**env.kwargs)``; its rows are its dataset
(``data.task=verifiers:package.module``, rlvr.data.verifiers_rows), each episode its own
``rollout`` with an OpenAI client pointed at the episode's URL, the group scored by its rubric
(``score_group``); the rubric's reward is the episode's.

An episode comes back as one ``Completion`` per sequence the endpoint recorded: the last one is
the episode's (the group holds one per episode, as for environments); earlier ones, where the
agent rewrote its history, ride in ``EpisodeInfo.earlier`` and ``expand_sequences`` lays them
out for training, each carrying its episode's reward.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import math
from collections.abc import Callable
from typing import Any

from rlvr.config.env import VERIFIERS, agent_kind
from rlvr.data.verifiers_rows import load_environment
from rlvr.envs.contain import Outcome, call_all
from rlvr.rewards.sandbox import resolve_target
from rlvr.rollout.base import Completion, EpisodeInfo, SamplingParams
from rlvr.rollout.endpoint import Endpoint, EndpointLimits, EpisodeLog


def is_agent_env(name: str | None) -> bool:
    return agent_kind(name) is not None


def agent_function(name: str) -> Callable[..., Any]:
    """The function ``env.name=agent:package.module:function`` names."""
    target = name.partition(":")[2]
    try:
        fn = resolve_target(target)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"env.name={name!r}: {type(exc).__name__}: {exc}") from exc
    if not callable(fn):
        raise ValueError(f"env.name={name!r}: {target} is not callable")
    return fn


def reward_of(value: Any) -> tuple[float, dict]:
    """(reward, info) of what an agent returned: a number, or ``reward``/``info`` as attributes
    or keys."""
    info: Any = {}
    if isinstance(value, dict):
        reward, info = value.get("reward"), value.get("info", {})
    elif hasattr(value, "reward"):
        reward, info = value.reward, getattr(value, "info", {}) or {}
    else:
        reward = value
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise TypeError(f"the agent returned {value!r}: a reward must be a number")
    if not math.isfinite(float(reward)):
        raise ValueError(f"the agent's reward must be finite, got {reward!r}")
    return float(reward), dict(info) if isinstance(info, dict) else {"info": info}


class FunctionPlayer:
    """``agent:package.module:function``: each episode a call of the function in its own thread."""

    def __init__(self, name: str, kwargs: dict) -> None:
        self.fn, self.kwargs = agent_function(name), dict(kwargs)

    def play(self, rows: list[dict], urls: list[list[str]], timeout_s: float) -> list[Outcome]:
        calls = [
            (lambda u=u, r=r: reward_of(self.fn(u, copy.deepcopy(r), **self.kwargs)))
            for r, row_urls in zip(rows, urls, strict=True)
            for u in row_urls
        ]
        return call_all(calls, timeout_s)


class VerifiersPlayer:
    """``verifiers:package.module``: each row's group of rollouts in one event loop (its own
    thread), every rollout with a client of its own episode, scored together by the rubric."""

    def __init__(self, name: str, kwargs: dict) -> None:
        self.env = load_verifiers_environment(name.partition(":")[2], kwargs)

    def play(self, rows: list[dict], urls: list[list[str]], timeout_s: float) -> list[Outcome]:
        calls = [
            (lambda r=r, u=u: asyncio.run(self._group(r, u, timeout_s)))
            for r, u in zip(rows, urls, strict=True)
        ]
        # the rollouts are bounded inside; this bound catches a rubric that hangs
        groups = call_all(calls, 2 * timeout_s)
        out = []
        for outcome, u in zip(groups, urls, strict=True):
            if outcome.ok:
                out += outcome.value
            else:
                out += [Outcome(False, error=outcome.error, timed_out=outcome.timed_out)] * len(u)
        return out

    async def _group(self, row: dict, urls: list[str], timeout_s: float) -> list[Outcome]:
        from openai import AsyncOpenAI
        from verifiers.clients import OpenAIChatCompletionsClient

        source = row.get("verifiers")
        if not isinstance(source, dict):
            raise ValueError("env.name=verifiers:... needs rows of data.task=verifiers:...")
        clients = [
            OpenAIChatCompletionsClient(
                AsyncOpenAI(base_url=u, api_key="rlvr", max_retries=0, timeout=timeout_s)
            )
            for u in urls
        ]
        runs = [
            asyncio.wait_for(
                self.env.rollout(copy.deepcopy(source), c, "rlvr-policy", {}), timeout_s
            )
            for c in clients
        ]
        states = await asyncio.gather(*runs, return_exceptions=True)
        done = [s for s in states if not isinstance(s, BaseException)]
        if done:
            if self.env.score_rollouts:
                await self.env.rubric.score_group(done)
            else:
                await self.env.rubric.dummy_score_group(done)
        out = []
        for s in states:
            if isinstance(s, BaseException):
                timed_out = isinstance(s, (asyncio.TimeoutError, TimeoutError))
                why = f"timed out after {timeout_s} s" if timed_out else f"{type(s).__name__}: {s}"
                out.append(Outcome(False, error=why, timed_out=timed_out))
            elif s.get("error") is not None:
                out.append(Outcome(False, error=f"verifiers rollout error: {s['error']!r}"))
            else:
                try:
                    out.append(Outcome(True, reward_of(s.get("reward"))))
                except (TypeError, ValueError) as exc:
                    out.append(Outcome(False, error=f"the rubric's reward: {exc}"))
        return out


def load_verifiers_environment(module: str, kwargs: dict):
    """``module.load_environment(**kwargs)`` (verifiers' convention), with errors naming it."""
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(f"env.name=verifiers:{module}: {exc}") from exc
    if not callable(getattr(mod, "load_environment", None)):
        raise ValueError(f"env.name=verifiers:{module}: the module has no load_environment()")
    try:
        return load_environment(module, kwargs)
    except TypeError as exc:
        raise ValueError(f"env.kwargs for env.name=verifiers:{module}: {exc}") from exc


class AgentRunner:
    """Plays a batch's episodes with agents through the endpoint (``run``: what
    rlvr.rollout.episodes.EpisodeRunner.run returns)."""

    def __init__(
        self,
        player,
        tokenizer,
        limits: EndpointLimits,
        timeout_s: float,
        window_s: float = 0.05,
    ) -> None:
        self.player, self.tokenizer, self.limits = player, tokenizer, limits
        self.timeout_s, self.window_s = timeout_s, window_s
        self.endpoint: Endpoint | None = None

    @classmethod
    def from_config(cls, cfg, tokenizer) -> AgentRunner:
        e, r = cfg.env, cfg.rollout
        name = e.name
        player = (
            VerifiersPlayer(name, e.kwargs)
            if name.startswith(VERIFIERS + ":")
            else (FunctionPlayer(name, e.kwargs))
        )
        limits = EndpointLimits(
            max_new_tokens=r.max_new_tokens,
            max_sequence_tokens=r.max_episode_tokens,
            max_prompt_tokens=cfg.data.max_prompt_tokens + r.max_episode_tokens,
            max_calls=r.max_turns,
        )
        return cls(player, tokenizer, limits, e.timeout_s)

    def _endpoint(self, engine, params: SamplingParams) -> Endpoint:
        if self.endpoint is not None and self.endpoint.engine is not engine:
            self.close()
        if self.endpoint is None:
            self.endpoint = Endpoint(
                engine, self.tokenizer, params, self.limits, window_s=self.window_s
            )
        self.endpoint.set_params(params)
        return self.endpoint

    def run(self, engine, rows: list[dict], params: SamplingParams):
        """``params.n`` episodes per row: (prompt texts, prompt ids, groups of Completions, one
        per episode: its last sequence, earlier ones in ``episode.earlier``)."""
        ep = self._endpoint(engine, params)
        opened = [[ep.open() for _ in range(params.n)] for _ in rows]
        urls = [[u for u, _ in row] for row in opened]
        try:
            outcomes = self.player.play(rows, urls, self.timeout_s)
        finally:  # also when a stop signal ends the step: a checkpoint is written next
            logs = [ep.finish(log.key) for row in opened for _, log in row]
            # an agent timed out with its request in the engine: the engine is the trainer's
            # (the hf engine's module, vLLM's weights to sync), so the step waits for that call
            ep.wait_idle()
        groups: list[list[Completion]] = [[] for _ in rows]
        prompts: list[list[int] | None] = [None] * len(rows)
        for k, (log, out) in enumerate(zip(logs, outcomes, strict=True)):
            i = k // params.n
            comp = _episode_completion(i, log, out, self.tokenizer)
            if prompts[i] is None and comp.prompt_ids:
                first = comp.episode.earlier[0] if comp.episode.earlier else comp
                prompts[i] = first.prompt_ids
            groups[i].append(comp)
        ids = [p or self._row_prompt(row) for p, row in zip(prompts, rows, strict=True)]
        for grp, p in zip(groups, ids, strict=True):
            for c in grp:
                c.prompt_ids = c.prompt_ids or p
        texts = [self.tokenizer.decode(p, skip_special_tokens=False) for p in ids]
        return texts, ids, groups

    def _row_prompt(self, row: dict) -> list[int]:
        ids = self.tokenizer(str(row.get("prompt") or " "), add_special_tokens=False).input_ids
        return ids or [self.tokenizer.eos_token_id]

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None


def _episode_completion(row: int, log: EpisodeLog, out: Outcome, tokenizer) -> Completion:
    with log.lock:  # a request still in flight after a timeout may add to it
        seqs = [copy.copy(s) for s in log.sequences]
        calls, splits, tool_calls = log.calls, log.splits, log.tool_calls
        refused = list(log.refused)
    info = EpisodeInfo(turns=calls, tool_calls=tool_calls, gives_reward=True)
    info.splits = splits
    if out.ok:
        info.env_reward, extra = out.value
        info.agent_info = extra
        if not seqs:
            info.failed = "the agent made no request to its base_url"
    else:
        info.failed = f"agent: {out.error}"
    if refused and not info.failed and not seqs:
        info.failed = f"agent: every request was refused: {refused[-1]}"
    comps = [
        Completion(
            prompt_index=row,
            token_ids=list(s.ids),
            logprobs=list(s.logprobs),
            text=tokenizer.decode(s.ids, skip_special_tokens=True),
            finish_reason=s.finish,
            loss_mask=list(s.mask),
            episode=info,
            prompt_ids=list(s.prompt),
        )
        for s in seqs
    ]
    for c in comps:
        info.model_tokens += sum(c.loss_mask)
        info.env_tokens += len(c.loss_mask) - sum(c.loss_mask)
    if not comps:  # nothing to train: the row's prompt, no tokens
        comps = [Completion(row, [], [], "", "stop", loss_mask=[], episode=info)]
    info.final_text = seqs[-1].text if seqs else ""
    info.transcript = [("model", s.text) for s in seqs]
    info.earlier = comps[:-1]
    return comps[-1]


def expand_sequences(groups: list[list[Completion]], width: int | None = None):
    """Lay out every sequence of the groups' episodes for training: each row's episodes, an
    episode's earlier sequences before its last, padded to ``width`` (at least the widest row)
    with empty fillers. Returns (groups, episode_of): ``episode_of[i]`` is the flat index of the
    sequence that stands for sequence i's episode (its last; i itself for it), -1 for a filler;
    None when no episode has earlier sequences (the groups are returned as they are)."""
    split = any(c.episode is not None and c.episode.earlier for g in groups for c in g)
    if not split and (width is None or all(len(g) == width for g in groups)):
        return groups, None
    need = max(
        (sum(1 + len(c.episode.earlier if c.episode else []) for c in g) for g in groups), default=0
    )
    width = max(need, width or 0)
    out, episode_of = [], []
    for p, g in enumerate(groups):
        row: list[Completion] = []
        for c in g:
            earlier = c.episode.earlier if c.episode is not None else []
            last = p * width + len(row) + len(earlier)
            for e in earlier:
                row.append(e)
                episode_of.append(last)
            row.append(c)
            episode_of.append(last)
        while len(row) < width:
            row.append(_filler(p, g[0] if g else None))
            episode_of.append(-1)
        out.append(row)
    return out, episode_of


def _filler(row: int, like: Completion | None) -> Completion:
    return Completion(
        row,
        [],
        [],
        "",
        "stop",
        loss_mask=[],
        episode=EpisodeInfo(),
        prompt_ids=like.prompt_ids if like else None,
    )


def agent_problems(cfg) -> list[str]:
    """What keeps ``env.name`` (an agent) from running: the function must import; the
    verifiers module must import and expose ``load_environment``."""
    name = cfg.env.name
    try:
        if name.startswith(VERIFIERS + ":"):
            module = name.partition(":")[2]
            try:
                mod = importlib.import_module(module)
            except ImportError as exc:
                return [f"env.name={name!r}: {exc} (pip install 'rlvr[agents]' for verifiers)"]
            if not callable(getattr(mod, "load_environment", None)):
                return [f"env.name={name!r}: the module has no load_environment()"]
        else:
            agent_function(name)
    except ValueError as exc:
        return [str(exc)]
    return []
