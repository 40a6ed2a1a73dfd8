"""OpenEnv environments (PyPI ``openenv-core``, the extra ``rlvr[openenv]``) as rlvr environments.

Two forms, one adapter (docs/environments.md, "OpenEnv"):

- in process: ``env.name=openenv:package.module:MyEnvironment``, a subclass of OpenEnv's
  ``Environment`` (``openenv.core.env_server.interfaces``); one fresh instance per episode, built
  with ``env.kwargs.env_kwargs``;
- a running server: ``env.name=openenv env.kwargs.base_url=http://host:8000``, through OpenEnv's
  own ``GenericEnvClient`` (its WebSocket session, one per episode).

The mapping. The model's turn becomes an Action: the text goes into one field, named by
``env.kwargs.action_field`` or, in process, found as the Action class's only ``str`` field (the
Action class: ``step``'s annotation, the class's generic arguments, or ``env.kwargs.action_class``).
An Observation becomes the environment's turn: its ``observation_field``, or its only text field
(``done``, ``reward`` and ``metadata`` are not text); a non-text field is written as JSON. Its
``reward`` and ``done`` are the step's. ``reset`` gets a seed (the row's ``seed`` when it has an
integer one, else a hash of its prompt), so the samples of one row start from the same state; the
prompt is the row's prompt, then the reset observation's text (``env.kwargs.prompt``).
"""

from __future__ import annotations

import inspect
import json
import typing
import zlib
from typing import Any

from rlvr.envs.base import Env, EnvError
from rlvr.rewards.sandbox import resolve_target

NOT_TEXT = ("done", "reward", "metadata")
PROMPTS = ("both", "row", "observation")
EXTRA_HINT = "OpenEnv environments need the extra: pip install 'rlvr[openenv]' (openenv-core)"


def openenv_types() -> tuple[type, type, type]:
    """OpenEnv's Environment, Action and Observation base classes (imported when used); a
    missing extra is a ValueError naming it, as a bad config knob is."""
    try:
        from openenv.core.env_server.interfaces import Environment
        from openenv.core.env_server.types import Action, Observation
    except ImportError as exc:
        raise ValueError(f"{EXTRA_HINT} ({exc})") from exc
    return Environment, Action, Observation


def environment_class(target: str) -> type:
    """The OpenEnv Environment subclass ``package.module:Class`` names, or ValueError naming it."""
    environment = openenv_types()[0]
    try:
        cls = resolve_target(target)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"env.name=openenv:{target}: {type(exc).__name__}: {exc}") from exc
    if not (inspect.isclass(cls) and issubclass(cls, environment)):
        raise ValueError(
            f"env.name=openenv:{target}: not a subclass of OpenEnv's Environment "
            "(openenv.core.env_server.interfaces.Environment)"
        )
    return cls


def _text_fields(model_cls: type) -> list[str]:
    """The fields of a pydantic class annotated ``str`` (or ``str | None``), not done/reward/metadata."""
    out = []
    for name, info in model_cls.model_fields.items():
        ann = info.annotation
        args = typing.get_args(ann)
        if name not in NOT_TEXT and (ann is str or (str in args and len(args) == 2)):
            out.append(name)
    return out


def _step_type(env_cls: type, key: str, base: type, position: int) -> type | None:
    """The Action (``key="action"``) or Observation (``"return"``) class ``env_cls`` declares:
    ``step``'s annotation, else its ``Environment[Act, Obs, State]`` generic arguments."""
    try:
        hint = typing.get_type_hints(env_cls.step).get(key)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: try the generics
        hint = None
    if inspect.isclass(hint) and issubclass(hint, base):
        return hint
    for klass in env_cls.__mro__:
        for orig in getattr(klass, "__orig_bases__", ()):
            args = typing.get_args(orig)
            arg = args[position] if len(args) > position else None
            if inspect.isclass(arg) and issubclass(arg, base):
                return arg
    return None


def _action_field(action_cls: type, field: str | None) -> str:
    fields = [f for f in action_cls.model_fields if f != "metadata"]
    if field is not None:
        if field not in action_cls.model_fields:
            raise ValueError(
                f"env.kwargs.action_field={field!r}: {action_cls.__name__} has no such field "
                f"(fields: {fields})"
            )
        return field
    text = _text_fields(action_cls)
    if len(text) != 1:
        raise ValueError(
            f"{action_cls.__name__} has {len(text)} text fields {text} (fields: {fields}): set "
            "env.kwargs.action_field to the one that gets the model's text"
        )
    return text[0]


def observation_text(obs: dict, field: str | None, where: str) -> str:
    """The text of an observation (its fields as a dict): ``field``, or its only text field."""
    if field is not None:
        if field not in obs:
            raise EnvError(
                f"env.kwargs.observation_field={field!r}: {where} has no such field "
                f"(fields: {sorted(obs)})"
            )
        value = obs[field]
        return value if isinstance(value, str) else json.dumps(value, default=str)
    text = [k for k, v in obs.items() if k not in NOT_TEXT and isinstance(v, str)]
    if len(text) != 1:
        raise EnvError(
            f"{where} has {len(text)} text fields {sorted(text)} (fields: {sorted(obs)}): set "
            "env.kwargs.observation_field to the one the model reads"
        )
    return obs[text[0]]


def _reward(value: Any) -> float | None:
    return None if value is None else float(value)


def row_seed(row: dict) -> int:
    """The row's integer ``seed``, else a hash of its prompt: the same for all its samples."""
    seed = row.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0:
        return seed
    return zlib.crc32(str(row.get("prompt", "")).encode())


class OpenEnvAdapter(Env):
    """One episode on an OpenEnv environment, in process or through a server (module docstring)."""

    gives_reward = True

    def __init__(
        self,
        env_class: str | None = None,
        base_url: str | None = None,
        action_field: str | None = None,
        observation_field: str | None = None,
        action_class: str | None = None,
        env_kwargs: dict | None = None,
        reset_kwargs: dict | None = None,
        prompt: str = "both",
        gives_reward: bool | None = True,
        observation_role: str = "user",
        stop: list[str] | None = None,
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 60.0,
    ) -> None:
        super().__init__()
        if (env_class is None) == (base_url is None):
            raise ValueError(
                "env.name=openenv needs exactly one of an Environment class "
                "(env.name=openenv:package.module:Class) and env.kwargs.base_url (a running server)"
            )
        if prompt not in PROMPTS:
            raise ValueError(f"env.kwargs.prompt={prompt!r}: one of {', '.join(PROMPTS)}")
        self.prompt_mode, self.observation_field = prompt, observation_field
        self.gives_reward, self.observation_role = gives_reward, observation_role
        self.stop = tuple(stop or ())  # strings that end a model turn (an action's closing tag)
        self.reset_kwargs = dict(reset_kwargs or {})
        self._env: Any = None
        self._client: Any = None
        self._opened = False  # the client's session (and its event-loop thread) started
        if base_url is not None:
            if action_field is None:
                raise ValueError(
                    "env.kwargs.action_field is needed with env.kwargs.base_url: the server's "
                    "Action field that gets the model's text (e.g. 'message')"
                )
            if env_kwargs:
                raise ValueError("env.kwargs.env_kwargs: the server builds its own environment")
            openenv_types()
            from openenv.core.generic_client import GenericEnvClient

            self.where = f"the server at {base_url}"
            self.action_field = action_field
            self._client = GenericEnvClient(
                base_url=base_url,
                connect_timeout_s=connect_timeout_s,
                message_timeout_s=message_timeout_s,
            ).sync()
            return
        self._init_local(env_class, action_field, action_class, dict(env_kwargs or {}))

    def _init_local(
        self, target: str, action_field: str | None, action_class: str | None, kwargs: dict
    ) -> None:
        _, action, observation = openenv_types()
        cls = environment_class(target)
        self.where = cls.__name__
        if action_class is not None:
            act = resolve_target(action_class)
            if not (inspect.isclass(act) and issubclass(act, action)):
                raise ValueError(f"env.kwargs.action_class={action_class!r}: not an OpenEnv Action")
        else:
            act = _step_type(cls, "action", action, 0)
            if act is None:
                raise ValueError(
                    f"{cls.__name__}: cannot tell its Action class (step's annotation or "
                    "Environment[Action, Observation, State]): set env.kwargs.action_class"
                )
        self.action_cls, self.action_field = act, _action_field(act, action_field)
        obs_cls = _step_type(cls, "return", observation, 1)
        if obs_cls is not None:  # check the field now; a bad one would fail every episode
            fields = obs_cls.model_fields if self.observation_field else _text_fields(obs_cls)
            try:
                observation_text(
                    dict.fromkeys(fields, ""), self.observation_field, obs_cls.__name__
                )
            except EnvError as exc:
                raise ValueError(str(exc)) from None
        try:
            self._env = cls(**kwargs)
        except TypeError as exc:
            raise ValueError(f"env.kwargs.env_kwargs for {cls.__name__}: {exc}") from exc

    def _reset_args(self, row: dict) -> dict:
        kwargs = {"seed": row_seed(row), **self.reset_kwargs}
        if self._env is None:
            return kwargs  # the server passes what its environment's reset accepts
        params = inspect.signature(self._env.reset).parameters
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return kwargs
        unknown = sorted(set(self.reset_kwargs) - set(params))
        if unknown:
            raise EnvError(
                f"env.kwargs.reset_kwargs {unknown}: {self.where}.reset takes {sorted(params)}"
            )
        return {k: v for k, v in kwargs.items() if k in params}

    def _unpack(self, obs: Any) -> tuple[str, float | None, bool]:
        """(text, reward, done) of an Observation (in process) or a StepResult (server)."""
        if self._client is not None:
            fields, reward, done = dict(obs.observation or {}), obs.reward, obs.done
            where = f"an observation from {self.where}"
        else:
            if not hasattr(obs, "model_dump"):
                raise EnvError(f"{self.where} returned {type(obs).__name__}, not an Observation")
            fields, reward, done = obs.model_dump(), obs.reward, obs.done
            where = type(obs).__name__
        return observation_text(fields, self.observation_field, where), _reward(reward), bool(done)

    def reset(self, row: dict) -> str:
        kwargs = self._reset_args(row)
        if self._client is not None:
            self._opened = True
            raw = self._client.reset(**kwargs)
        else:
            raw = self._env.reset(**kwargs)
        question = str(row.get("prompt", ""))
        if self.prompt_mode == "row":
            return question
        text = self._unpack(raw)[0]
        if not text:
            return question
        if self.prompt_mode == "observation":
            return text
        return f"{question}\n\n{text}" if question else text

    def step(self, model_text: str) -> tuple[str | None, float | None, bool]:
        if self._client is not None:
            try:
                raw = self._client.step({self.action_field: model_text})
            except RuntimeError as exc:  # the server refused the action: name the field sent
                raise EnvError(
                    f"{self.where}: step({self.action_field}=<model text>): {exc}"
                ) from exc
        else:
            try:
                action = self.action_cls(**{self.action_field: model_text})
            except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError, named
                raise EnvError(
                    f"{self.action_cls.__name__}({self.action_field}=<model text>): {exc}"
                ) from exc
            raw = self._env.step(action)
        text, reward, done = self._unpack(raw)
        return (None if done else text), reward, done

    def close(self) -> None:
        if self._client is not None:
            if self._opened:
                self._client.close()
        elif self._env is not None:
            self._env.close()
