"""Multi-turn episodes over an environment, token in, token out (docs/environments.md).

An episode is the prompt the environment's ``reset(row)`` gives, then the model's turn (sampled
by the engine), the environment's turn (``step(model_text)``), and so on until the environment
says done, ``rollout.max_turns`` model turns or ``rollout.max_episode_tokens`` tokens after the
prompt. It comes back as one ``Completion``: every token after the prompt, with the engine's
log-prob of each model token and ``loss_mask`` 1 at the model's tokens, 0 at the environment's.
The model's tokens are kept exactly as sampled; each environment turn is rendered once with the
chat template (rlvr.envs.turns) and appended as ids; nothing is decoded and encoded again.

Each turn is one ``engine.generate`` call over every live episode, its prompt the episode's ids
so far (the first turn samples a row's group together, ``n = group size``). Environment calls
run concurrently, each at most ``env.timeout_s`` (rlvr.envs.contain): an environment that
raises, hangs, breaks the protocol or floods the context (``env.max_observation_chars``) fails
its own episode only (``EpisodeInfo.failed``; the step gives it zero advantage).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from rlvr.envs.base import check_step
from rlvr.envs.contain import call_all
from rlvr.envs.turns import TurnRenderer
from rlvr.rollout.base import Completion, EpisodeInfo, SamplingParams
from rlvr.sandbox import configure as configure_sandbox

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int
    max_episode_tokens: int
    timeout_s: float
    max_observation_chars: int


@dataclass
class _Episode:
    row: int
    env: object
    sample: int = 0  # which of its row's samples (0 .. n-1)
    info: EpisodeInfo = field(default_factory=EpisodeInfo)
    prompt: list[int] | None = None
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str = ""  # "" while it runs
    ended_with_eos: bool = False  # the last model turn ended with the EOS token

    def add(self, ids: list[int], logprobs: list[float] | None) -> None:
        model = logprobs is not None
        self.ids += ids
        self.mask += [int(model)] * len(ids)
        self.logprobs += logprobs if model else [0.0] * len(ids)
        if model:
            self.info.model_tokens += len(ids)
        else:
            self.info.env_tokens += len(ids)

    def fail(self, why: str) -> None:
        self.info.failed, self.finish = why, "failed"


def run_episodes(
    engine,
    renderer: TurnRenderer,
    make_env: Callable[[], object],
    rows: list[dict],
    params: SamplingParams,
    limits: EpisodeLimits,
) -> tuple[list[str], list[list[int]], list[list[Completion]]]:
    """``params.n`` episodes per row: (prompt texts, prompt ids, groups of Completions)."""
    g = params.n
    eps = [_Episode(i, None, k) for i in range(len(rows)) for k in range(g)]
    made = call_all([make_env] * len(eps), limits.timeout_s)
    for ep, out in zip(eps, made, strict=True):
        if out.ok:
            ep.env = out.value
        else:
            ep.fail(f"constructing the environment: {out.error}")
    resets = call_all([_bound(ep.env, "reset", rows[ep.row]) for ep in eps], limits.timeout_s)
    texts: list[str | None] = [None] * len(rows)
    for ep, out in zip(eps, resets, strict=True):
        if ep.finish:
            continue
        if not out.ok:
            ep.fail(f"reset: {out.error}")
            continue
        try:
            text = renderer.prompt_text(out.value, rows[ep.row].get("system_prompt"))
        except Exception as exc:  # noqa: BLE001 - a bad prompt fails its episode
            ep.fail(f"reset: {exc}")
            continue
        if texts[ep.row] is None:
            texts[ep.row] = text
        elif text != texts[ep.row]:
            ep.fail("reset() gave the samples of one row different prompts")
    for i, row in enumerate(rows):  # a row whose every reset failed keeps its own prompt
        if texts[i] is None:
            texts[i] = renderer.prompt_text(str(row.get("prompt", "")))
    prompt_ids = [renderer.encode(t) for t in texts]
    for ep in eps:
        ep.prompt = prompt_ids[ep.row]
        if ep.env is not None:
            ep.info.gives_reward = getattr(ep.env, "gives_reward", None)
    stop = tuple(params.stop) + tuple(
        s for s in getattr(next((e.env for e in eps if e.env), None), "stop", ()) or ()
    )
    for turn in range(limits.max_turns):
        live = [ep for ep in eps if not ep.finish]
        if not live:
            break
        _model_turn(engine, renderer, live, rows, params, stop, turn, limits)
        _env_turn(renderer, [ep for ep in live if not ep.finish], turn, limits)
    for ep in eps:
        if not ep.finish:
            ep.finish = "turns"
    call_all([_bound(ep.env, "close") for ep in eps if ep.env is not None], limits.timeout_s)
    groups: list[list[Completion]] = [[] for _ in rows]
    for ep in eps:
        groups[ep.row].append(_completion(ep, renderer))
    return list(texts), prompt_ids, groups


def _bound(env, method: str, *args) -> Callable[[], object]:
    def call():
        fn = getattr(env, method, None)
        if fn is None:
            if method == "close":
                return None
            raise AttributeError(f"the environment has no {method}()")
        return fn(*args)

    return call


def _model_turn(engine, renderer, live, rows, params, stop, turn, limits) -> None:
    """One generate call over the live episodes; each keeps its reply's tokens and log-probs,
    cut at its remaining token budget."""
    seed = None if params.seed is None else params.seed + 7919 * turn
    if turn == 0:  # a row's group shares its prompt: sample the group together
        by_row = sorted({ep.row for ep in live})
        prompts = [_row_prompt(live, r) for r in by_row]
        p = dataclasses.replace(params, stop=stop, seed=seed, prompt_seeds=_seeds(params, by_row))
        out = engine.generate(prompts, p)
        comps = {}
        for r, group in zip(by_row, out, strict=True):
            mine = [ep for ep in live if ep.row == r]
            comps.update({id(ep): c for ep, c in zip(mine, group, strict=False)})
    else:
        prompts = [ep.prompt + ep.ids for ep in live]
        seeds = None
        if params.prompt_seeds is not None:
            # from the episode alone (its row's seed, its sample, the turn), never from its place
            # among the live episodes: which episodes are still live beside it differs between a
            # rank's share of the batch and the whole batch in one process
            seeds = tuple(params.prompt_seeds[ep.row] * 31 + 1009 * turn + ep.sample for ep in live)
        p = dataclasses.replace(params, n=1, stop=stop, seed=seed, prompt_seeds=seeds)
        comps = {id(ep): grp[0] for ep, grp in zip(live, engine.generate(prompts, p), strict=True)}
    for ep in live:
        c = comps[id(ep)]
        room = limits.max_episode_tokens - len(ep.ids)
        tokens, lps = c.token_ids[:room], c.logprobs[:room]
        text = (
            c.text
            if len(tokens) == len(c.token_ids)
            else renderer.tokenizer.decode(tokens, skip_special_tokens=True)
        )
        ep.add(list(tokens), list(lps))
        ep.info.turns += 1
        ep.info.final_text = text
        ep.info.transcript.append(("model", text))
        ep.ended_with_eos = bool(tokens) and tokens[-1] == renderer.eos_id
        if (
            c.finish_reason == "length"
            or len(tokens) < len(c.token_ids)
            or len(ep.ids) >= limits.max_episode_tokens
        ):
            ep.finish = "length"


def _row_prompt(live, row: int) -> list[int]:
    return next(ep.prompt for ep in live if ep.row == row)


def _seeds(params: SamplingParams, rows: list[int]) -> tuple[int, ...] | None:
    if params.prompt_seeds is None:
        return None
    return tuple(params.prompt_seeds[r] for r in rows)


def _env_turn(renderer, live, turn, limits) -> None:
    """Every live episode's environment step (concurrently, each under env.timeout_s), and its
    observation appended as the next environment turn."""
    outs = call_all([_bound(ep.env, "step", ep.info.final_text) for ep in live], limits.timeout_s)
    for ep, out in zip(live, outs, strict=True):
        _count_tools(ep)
        if not out.ok:
            ep.fail(f"step: {out.error}")
            continue
        try:
            obs, reward, done = check_step(out.value)
        except Exception as exc:  # noqa: BLE001
            ep.fail(str(exc))
            continue
        if reward is not None:
            ep.info.env_reward = (ep.info.env_reward or 0.0) + reward
        if done:
            ep.finish = "stop"
            continue
        if len(obs) > limits.max_observation_chars:
            ep.fail(
                f"step: an observation of {len(obs)} characters, over "
                f"env.max_observation_chars={limits.max_observation_chars}"
            )
            continue
        if turn + 1 >= limits.max_turns:
            ep.finish = "turns"  # no model turn would answer it
            continue
        role = getattr(ep.env, "observation_role", "user") or "user"
        try:
            ids = renderer.env_turn_ids(obs, role, ep.ended_with_eos)
        except Exception as exc:  # noqa: BLE001 - a role the template refuses
            ep.fail(f"rendering the observation: {exc}")
            continue
        if len(ep.ids) + len(ids) >= limits.max_episode_tokens:
            ep.finish = "length"  # no room left for a model token after it
            continue
        ep.add(ids, None)
        ep.info.transcript.append(("env", obs))


def _count_tools(ep: _Episode) -> None:
    for name in ("tool_calls", "tool_failures"):
        value = getattr(ep.env, name, 0)
        if isinstance(value, int) and not isinstance(value, bool):
            setattr(ep.info, name, value)


def _completion(ep: _Episode, renderer: TurnRenderer) -> Completion:
    return Completion(
        prompt_index=ep.row,
        token_ids=ep.ids,
        logprobs=ep.logprobs,
        text=renderer.tokenizer.decode(ep.ids, skip_special_tokens=True),
        finish_reason=ep.finish,
        loss_mask=ep.mask,
        episode=ep.info,
    )


class EnvFailureError(RuntimeError):
    """More than env.max_failure_fraction of a step's episodes failed: the run stops."""


class EpisodeRunner:
    """What a run needs to play its episodes: the environment factory, the turn renderer and
    the limits, built once from the config (``from_config``: None without env.name)."""

    def __init__(
        self, make_env, renderer: TurnRenderer, limits: EpisodeLimits, *, warn: bool = True
    ) -> None:
        self.make_env, self.renderer, self.limits = make_env, renderer, limits
        if warn and (why := renderer.rewrite_warning()):  # once per run, before its first episode
            log.warning(why)

    @classmethod
    def from_config(cls, cfg, tokenizer, *, warn: bool = True) -> EpisodeRunner | None:
        """The runner of ``env.name``: None without one; agents (``agent:...``,
        ``verifiers:...``) play through the OpenAI endpoint (rlvr.rollout.agents.AgentRunner).
        ``warn=False``: a runner that only renders prompts (the pre-run checks), which leaves
        the template's warning to the run's own runner."""
        # the run's sandbox settings, for whatever runs model-written code in this process
        # (the Python tool, the code reward); training and evaluation both pass here
        configure_sandbox(cfg.sandbox)
        if not cfg.episodes:
            return None
        from rlvr.rollout.agents import AgentRunner, is_agent_env

        if is_agent_env(cfg.env.name):
            return AgentRunner.from_config(cfg, tokenizer)
        from rlvr.envs.registry import env_factory

        e, r = cfg.env, cfg.rollout
        limits = EpisodeLimits(
            r.max_turns, r.max_episode_tokens, e.timeout_s, e.max_observation_chars
        )
        renderer = TurnRenderer(cfg.data.template, tokenizer, cfg.data.system_prompt)
        return cls(env_factory(e.name, e.kwargs), renderer, limits, warn=warn)

    def first_prompts(self, rows: list[dict], at_once: int = 64) -> list[str | None]:
        """The text each row's episodes start from, as `run_episodes` renders it: a fresh
        environment's ``reset(row)`` (under env.timeout_s, ``at_once`` rows at a time), closed
        at once, so checking a row leaves nothing running. None where the environment could not
        be built or reset: those episodes fail, contained, when they run."""

        def first(row: dict) -> Callable[[], str]:
            def call() -> str:
                env = self.make_env()
                try:
                    prompt = _bound(env, "reset", row)()
                finally:
                    _bound(env, "close")()
                return self.renderer.prompt_text(prompt, row.get("system_prompt"))

            return call

        out: list[str | None] = []
        for start in range(0, len(rows), at_once):
            part = rows[start : start + at_once]
            for o in call_all([first(r) for r in part], self.limits.timeout_s):
                out.append(o.value if o.ok else None)
        return out

    def run(self, engine, rows: list[dict], params: SamplingParams):
        """``params.n`` episodes per row: (prompt texts, prompt ids, groups)."""
        return run_episodes(engine, self.renderer, self.make_env, rows, params, self.limits)


def episode_scores(
    comps: list[Completion], scores: list[float], valid: list[bool]
) -> tuple[list[float], list[bool]]:
    """Each sequence's score and validity once its episode is counted: a failed environment
    makes it invalid (zero advantage); an environment's rewards replace the reward specs' score
    where it gives the reward (``gives_reward`` True, or unset and it gave one)."""
    out_s, out_v = list(scores), list(valid)
    for i, c in enumerate(comps):
        ep = c.episode
        if ep is None:
            continue
        if ep.failed:
            out_s[i], out_v[i] = 0.0, False
        elif ep.gives_reward or (ep.gives_reward is None and ep.env_reward is not None):
            out_s[i], out_v[i] = float(ep.env_reward or 0.0), True
    return out_s, out_v


def check_env_failures(metrics: dict, comps: list[Completion], max_fraction: float) -> None:
    """EnvFailureError when the step's ``env_failure_rate`` (every rank's episodes) is above
    ``max_fraction``, showing one of this rank's failures."""
    rate = metrics.get("env_failure_rate")
    if rate is None or rate <= max_fraction:
        return
    shown = next((c.episode.failed for c in comps if c.episode and c.episode.failed), "")
    raise EnvFailureError(
        f"{rate:.0%} of this step's episodes failed in their environment (more than "
        f"env.max_failure_fraction={max_fraction}); for example: {shown}"
    )
