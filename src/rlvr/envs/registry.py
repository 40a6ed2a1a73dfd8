"""``env.name`` -> a factory of fresh environment instances (one per episode).

``openenv:package.module:Class`` (an OpenEnv Environment in process) and ``openenv`` (a running
OpenEnv server at ``env.kwargs.base_url``) go through the OpenEnv adapter
(rlvr.envs.openenv_adapter), the Environment class passed to it as ``env_class``."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from rlvr.config.env import OPENENV
from rlvr.envs.openenv_adapter import OpenEnvAdapter, environment_class, openenv_types
from rlvr.rewards.sandbox import resolve_target


def _builtins() -> dict[str, type]:
    from rlvr.envs.calculator import CalculatorEnv
    from rlvr.envs.guess import GuessNumberEnv
    from rlvr.envs.python_tool import PythonToolEnv

    return {"calculator": CalculatorEnv, "python": PythonToolEnv, "guess_number": GuessNumberEnv}


def _openenv(name: str, kwargs: dict) -> tuple[type, dict]:
    """The adapter class and its keyword arguments for ``openenv[:package.module:Class]``."""
    target = name.partition(":")[2]
    if target:
        if "env_class" in kwargs:
            raise ValueError(f"env.name={name!r} names the class: leave out env.kwargs.env_class")
        kwargs = {**kwargs, "env_class": target}
    return OpenEnvAdapter, kwargs


def env_class(name: str) -> type:
    """The class ``env.name`` names: a built-in's short name or ``package.module:Class``
    (``openenv[:...]``: the OpenEnv adapter)."""
    if name == OPENENV or name.startswith(OPENENV + ":"):
        target = name.partition(":")[2]
        if target:
            environment_class(target)
        else:
            openenv_types()  # the extra is installed
        return _openenv(name, {})[0]
    builtins = _builtins()
    if name in builtins:
        return builtins[name]
    if ":" not in name:
        raise ValueError(
            f"env.name={name!r}: not a built-in ({', '.join(builtins)}) nor 'package.module:Class'"
        )
    try:
        cls = resolve_target(name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"env.name={name!r}: {type(exc).__name__}: {exc}") from exc
    if not inspect.isclass(cls) or not all(
        callable(getattr(cls, m, None)) for m in ("reset", "step")
    ):
        raise ValueError(f"env.name={name!r}: must be a class with reset(row) and step(text)")
    return cls


def env_factory(name: str, kwargs: dict | None = None) -> Callable[[], object]:
    """A function making a fresh instance of ``env.name`` with ``env.kwargs`` for each episode;
    constructing one here first checks the keyword arguments (a bad one names the knob)."""
    kwargs = dict(kwargs or {})
    if name == OPENENV or name.startswith(OPENENV + ":"):
        cls, kwargs = _openenv(name, kwargs)
    else:
        cls = env_class(name)
    try:
        probe = cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"env.kwargs for env.name={name!r}: {exc}") from exc
    close = getattr(probe, "close", None)
    if callable(close):
        close()
    return lambda: cls(**kwargs)
