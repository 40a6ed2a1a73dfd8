"""``env.name`` -> a factory of fresh environment instances (one per episode)."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from rlvr.rewards.sandbox import resolve_target


def _builtins() -> dict[str, type]:
    from rlvr.envs.calculator import CalculatorEnv
    from rlvr.envs.guess import GuessNumberEnv
    from rlvr.envs.python_tool import PythonToolEnv

    return {"calculator": CalculatorEnv, "python": PythonToolEnv, "guess_number": GuessNumberEnv}


def env_class(name: str) -> type:
    """The class ``env.name`` names: a built-in's short name or ``package.module:Class``."""
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
    cls = env_class(name)
    kwargs = dict(kwargs or {})
    try:
        probe = cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"env.kwargs for env.name={name!r}: {exc}") from exc
    close = getattr(probe, "close", None)
    if callable(close):
        close()
    return lambda: cls(**kwargs)
