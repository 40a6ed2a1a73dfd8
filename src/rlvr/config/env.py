"""The `env` section: multi-turn episodes over an environment (docs/environments.md).

``env.name`` unset (the default) keeps rlvr single-turn: one reply per prompt, scored by the
reward specs. Set, every prompt row starts one episode per sample: the model's turn, the
environment's turn, ... until the environment says done, ``rollout.max_turns`` or
``rollout.max_episode_tokens``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rlvr.config.base import Section

# Built-in environments by short name (rlvr.envs.registry maps them to their classes); "openenv"
# (with env.kwargs.base_url) or "openenv:package.module:Class" go through the OpenEnv adapter.
BUILTIN_ENVS = ("calculator", "python", "guess_number")
OPENENV = "openenv"
# agents through the OpenAI-compatible endpoint (rlvr.rollout.agents): a function, or a verifiers
# environment module
AGENT, VERIFIERS = "agent", "verifiers"
# the objectives whose advantage is one number per sequence, which an agent episode's sequences
# share (rlvr.training.episode_groups)
AGENT_OBJECTIVES = ("drgrpo", "grpo", "rloo", "gspo", "cispo")

# What a built-in task turns on when the config does not give env.name (docs/environments.md,
# "The calc_tool task"): the calculator, shown by one worked example, and episode limits that
# fit a call, its result and an answer. A config that gives env.name (even null: the same
# problems single-turn) gets none of these; keys the config gives win.
TASK_DEFAULTS: dict[str, dict[str, dict[str, Any]]] = {
    "calc_tool": {
        "env": {"name": "calculator", "kwargs": {"instructions": False, "few_shot": 1}},
        "rollout": {"max_turns": 3, "max_new_tokens": 32, "max_episode_tokens": 96},
    }
}


class EnvConfig(Section):
    name: str | None = Field(
        None,
        description="Environment of multi-turn episodes: a built-in (calculator, python, "
        "guess_number), a user class 'package.module:Class', an OpenEnv Environment "
        "'openenv:package.module:Class' or 'openenv' with env.kwargs.base_url (a running OpenEnv "
        "server), an agent 'agent:package.module:function' (fn(base_url, row) -> reward, "
        "through the OpenAI endpoint) or a verifiers environment 'verifiers:package.module'; "
        "null: single-turn replies.",
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the environment's constructor."
    )
    timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest reset() or step() call; past it the episode is marked failed "
        "(zero advantage) and the batch goes on without it.",
    )
    max_failure_fraction: float = Field(
        0.25,
        ge=0.0,
        le=1.0,
        description="The run stops when more than this share of a step's episodes fail "
        "(an environment that raised, hung or returned an observation over "
        "env.max_observation_chars).",
    )
    max_observation_chars: int = Field(
        4000,
        gt=0,
        description="An observation longer than this marks its episode failed (a tool that "
        "floods the context).",
    )

    def agent_kind(self) -> str | None:
        """``agent`` or ``verifiers`` when ``name`` runs an agent through the endpoint (it
        writes its own requests and its reward scores the episode), else None."""
        return agent_kind(self.name)


def agent_kind(name: str | None) -> str | None:
    """``EnvConfig.agent_kind`` for an ``env.name``: the one test of an agent name."""
    kind, sep, _ = (name or "").partition(":")
    return kind if sep and kind in (AGENT, VERIFIERS) else None


def with_task_defaults(data: Any) -> Any:
    """The raw config mapping ``data`` (before validation) with its task's ``TASK_DEFAULTS``
    filled in where it gives neither env.name nor the key itself."""
    if not isinstance(data, dict):
        return data
    name = _given(data.get("env")).get("name")
    if isinstance(name, str) and name.startswith(VERIFIERS + ":"):
        return _verifiers_rows(data, name)
    task = _given(data.get("data")).get("task")
    defaults = TASK_DEFAULTS.get(task) if isinstance(task, str) else None
    if defaults is None or "name" in _given(data.get("env")):
        return data
    out = dict(data)
    for section, values in defaults.items():
        out[section] = _merged(values, _given(out.get(section)))
    return out


def _verifiers_rows(data: dict, name: str) -> dict:
    """``env.name=verifiers:MODULE`` reads its rows from the environment's dataset
    (``data.task=verifiers:MODULE``, ``data.task_kwargs`` = ``env.kwargs``) unless the config
    names a task."""
    given = _given(data.get("data"))
    if "task" in given:
        return data
    kwargs = _given(data.get("env")).get("kwargs", {})
    return {**data, "data": {**given, "task": name, "task_kwargs": kwargs}}


def _given(section: Any) -> dict:
    """A section's keys as given: a mapping, or a section object's explicitly set fields."""
    if isinstance(section, Section):
        return section.model_dump(exclude_unset=True)
    return section if isinstance(section, dict) else {}


def _merged(defaults: dict, given: dict) -> dict:
    out = dict(defaults)
    for key, value in given.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both else value
    return out


def _agent_rules(cfg) -> list[str]:
    e, out = cfg.env, []
    kind, _, target = e.name.partition(":")
    if not target or (kind == AGENT and ":" not in target):
        form = "agent:package.module:function" if kind == AGENT else "verifiers:package.module"
        out.append(f"env.name={e.name!r}: must be {form}")
    if cfg.algo.objective not in AGENT_OBJECTIVES:
        out.append(
            f"algo.objective={cfg.algo.objective} with env.name={e.name}: agents need one of "
            f"{', '.join(AGENT_OBJECTIVES)} (an episode the agent split into several sequences "
            "shares its one advantage among them)"
        )
    if cfg.algo.dynamic_sampling:
        out.append(
            "algo.dynamic_sampling with an agent env.name: not supported yet (a round's groups "
            "are as wide as its episodes' sequences); set algo.dynamic_sampling=false"
        )
    return out


def env_problems(cfg) -> list[str]:
    """What multi-turn episodes cannot run with (yet), each naming the knob (``cfg``: the run
    Config; the objective's own support is checked in rlvr.training.preflight.checks)."""
    e = cfg.env
    if not cfg.episodes:
        return []
    out = []
    if e.name == OPENENV and not (e.kwargs.get("base_url") or e.kwargs.get("env_class")):
        out.append(
            "env.name=openenv needs env.kwargs.base_url (a running OpenEnv server) or the class: "
            "env.name=openenv:package.module:Class"
        )
    elif e.name not in (*BUILTIN_ENVS, OPENENV) and ":" not in e.name:
        out.append(
            f"env.name={e.name!r}: not a built-in ({', '.join(BUILTIN_ENVS)}) nor a user class "
            "'package.module:Class'"
        )
    if e.name.startswith((AGENT + ":", VERIFIERS + ":")):
        out.extend(_agent_rules(cfg))
    if cfg.rollout.tensor_parallel_size > 1:
        out.append(
            "rollout.tensor_parallel_size>1 with env.name: not supported yet (the ranks of a "
            "tensor-parallel group generate in lockstep, and their episodes end after different "
            "turns); use rollout.tensor_parallel_size=1"
        )
    if cfg.rollout.max_staleness:
        out.append(
            f"rollout.max_staleness={cfg.rollout.max_staleness} with env.name: not supported yet "
            "(episodes are generated in the step); use rollout.max_staleness=0"
        )
    if cfg.reward.overlong_buffer:
        out.append(
            "reward.overlong_buffer with env.name: not supported yet (the penalty measures one "
            "reply against rollout.max_new_tokens, an episode has several); set it to 0"
        )
    if cfg.data.template == "r1":
        out.append(
            "data.template=r1 with env.name: r1 is a single-turn format; use chat, qwen_math or "
            "none (docs/environments.md)"
        )
    if cfg.data.task == "shapes":
        out.append("data.task=shapes with env.name: episodes take text prompts only for now")
    if cfg.rollout.max_episode_tokens < cfg.rollout.max_new_tokens:
        out.append(
            f"rollout.max_episode_tokens={cfg.rollout.max_episode_tokens} must be >= "
            f"rollout.max_new_tokens={cfg.rollout.max_new_tokens} (a model turn fits in an episode)"
        )
    return out
