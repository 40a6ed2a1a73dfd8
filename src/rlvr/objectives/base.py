"""The objective protocol and its registry: one class per objective (or family), one file each.

An objective says what the step must compute for it (``needs``), turns a scored rollout batch
into what its loss consumes (``prepare``: advantages, listwise weights, returns), computes the
loss of one micro-batch with the minibatch's global counts (``loss``), says how a minibatch may
be cut into micro-batches (``micro_batches``) and checks its own config knobs (``check``).
The step and the update loop only call these methods: no objective name is tested outside
``OBJECTIVES``.

Adding an objective: a file in this package with a subclass of ``Objective`` decorated by
``@register("name")``, and its import in ``__init__.py`` (docs/DESIGN.md, "Add an objective").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, TypeVar

if TYPE_CHECKING:
    import torch

    from rlvr.config import Config
    from rlvr.training.batch import MicroBatch, MinibatchCounts, RolloutBatch

OBJECTIVES: dict[str, type[Objective]] = {}
T = TypeVar("T", bound="type[Objective]")


def register(name: str) -> Callable[[T], T]:
    """Class decorator: make an objective selectable as ``algo.objective=name``."""

    def decorator(cls: T) -> T:
        if name in OBJECTIVES and OBJECTIVES[name] is not cls:
            raise ValueError(f"objective {name!r} is already registered")
        cls.name = name
        OBJECTIVES[name] = cls
        return cls

    return decorator


@dataclass(frozen=True)
class Needs:
    """What the step computes before ``prepare``: each costs a forward pass over the batch."""

    reference: bool = False  # log-probs of the frozen reference policy
    old_logp: bool = False  # log-probs of the policy that sampled (no grad), before the update
    values: bool = False  # the critic's value of every completion token (PPO)


class Objective:
    """Base class: a policy-gradient objective over group-sampled completions."""

    name: ClassVar[str] = ""
    # Loss aggregation when algo.loss_agg=auto (rlvr.algorithms.AGG_MODES).
    default_loss_agg: ClassVar[str] = "seq_mean_token_sum_norm"
    # True: a micro-batch must hold whole prompt groups, in group order (listwise losses).
    whole_groups: ClassVar[bool] = False

    def __init__(self, cfg: Config, tokenizer=None) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        a = cfg.algo
        self.agg_mode = a.loss_agg if a.loss_agg != "auto" else self.default_loss_agg

    # ------------------------------------------------------------------ config
    @classmethod
    def check(cls, cfg: Config) -> list[str]:
        """This objective's own config rules, each message naming the knob."""
        return []

    # ------------------------------------------------------------------ the step
    def needs(self) -> Needs:
        a = self.cfg.algo
        return Needs(reference=a.beta > 0, old_logp=a.epochs_per_batch > 1 or a.minibatches > 1)

    def prepare(self, batch: RolloutBatch) -> dict[str, float]:
        """Fill ``batch`` with what ``loss`` reads (advantages, ...); returns statistics."""
        raise NotImplementedError

    def micro_batches(self, indices: list[int], batch: RolloutBatch) -> list[list[int]]:
        """How the sequences ``indices`` of one minibatch are cut into forward/backward passes."""
        raise NotImplementedError

    def loss(self, mb: MicroBatch, counts: MinibatchCounts) -> tuple[torch.Tensor, dict]:
        """Loss of one micro-batch, already divided by the minibatch's global denominators."""
        raise NotImplementedError


def build_objective(cfg: Config, tokenizer=None) -> Objective:
    """The objective ``cfg.algo.objective`` names, built for this run."""
    return OBJECTIVES[cfg.algo.objective](cfg, tokenizer)
