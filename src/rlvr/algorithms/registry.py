"""Name -> function registries, so a new estimator or loss is one decorated function.

Two registries live here: advantage estimators (``grpo``, ``drgrpo``, ``rloo``, ``gae``,
``psgrpo_steps``) and losses (``ppo_clip``, ``value_clip``, ``maxent_listwise``,
``maxent_clip``). Each registered function keeps its own signature (a group estimator takes
``[P, G]`` rewards, GAE takes token tensors); the registry only maps names to callables and
gives a clear error for an unknown name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class Registry:
    """A named mapping from string keys to callables, with helpful errors.

    ``kind`` is used only in error messages ("unknown advantage estimator 'x'").
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, Callable[..., Any]] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator registering ``fn`` under ``name``; a duplicate name is an error."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def decorator(fn: F) -> F:
            if name in self._items and self._items[name] is not fn:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> Callable[..., Any]:
        """The callable registered as ``name``; ``KeyError`` listing known names otherwise."""
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(
                f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}"
            ) from None

    def names(self) -> tuple[str, ...]:
        """Registered names, sorted."""
        return tuple(sorted(self._items))


ADVANTAGES = Registry("advantage estimator")
LOSSES = Registry("loss")


def register_advantage(name: str) -> Callable[[F], F]:
    """Register an advantage estimator under ``name`` (decorator)."""
    return ADVANTAGES.register(name)


def get_advantage(name: str) -> Callable[..., Any]:
    """The advantage estimator registered as ``name``; ``KeyError`` lists the known ones."""
    return ADVANTAGES.get(name)


def advantage_names() -> tuple[str, ...]:
    """Names of all registered advantage estimators."""
    return ADVANTAGES.names()


def register_loss(name: str) -> Callable[[F], F]:
    """Register a loss function under ``name`` (decorator)."""
    return LOSSES.register(name)


def get_loss(name: str) -> Callable[..., Any]:
    """The loss registered as ``name``; ``KeyError`` lists the known ones."""
    return LOSSES.get(name)


def loss_names() -> tuple[str, ...]:
    """Names of all registered losses."""
    return LOSSES.names()
