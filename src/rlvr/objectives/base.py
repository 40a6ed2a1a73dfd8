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

import torch

from rlvr.algorithms import aggregate, kl_estimate, policy_loss, ratio_stats
from rlvr.model.forward import SequenceBatch, policy_outputs
from rlvr.objectives.micro_batches import length_micro_batches

if TYPE_CHECKING:
    from rlvr.config import Config
    from rlvr.objectives.batch import MicroBatch, MinibatchCounts, RolloutBatch

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


def no_wrap(module: torch.nn.Module) -> torch.nn.Module:
    """``attach``'s default ``wrap``: one process, nothing to reduce."""
    return module


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
    # Whether policy_term weights tokens by batch.tok["tis_weights"] (algo.rollout_correction,
    # algo.tis_cap).
    supports_tis: ClassVar[bool] = True
    # False: its preparation reads a reply's text or steps, not a multi-turn episode (env.name)
    supports_episodes: ClassVar[bool] = True
    # The paper's values of algo.* knobs, used where the user set none (the knob is not in the
    # section's model_fields_set): `rlvr.training.preflight.checks.apply_objective_defaults`.
    defaults: ClassVar[dict[str, float]] = {}

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

    # What the objective can take, as ``cfg`` configures it: the checks ask these, never the
    # class flags, so an objective composed of others (gspo_token's advantage source) answers
    # for what it composes.
    @classmethod
    def takes_correction(cls, cfg: Config) -> bool:
        """Whether its policy term weights tokens by a rollout correction (``supports_tis``)."""
        return cls.supports_tis

    @classmethod
    def takes_episodes(cls, cfg: Config) -> bool:
        """Whether its preparation can read multi-turn episodes (``supports_episodes``)."""
        return cls.supports_episodes

    # ------------------------------------------------------------------ set-up
    def attach(
        self,
        model: torch.nn.Module,
        device: torch.device,
        wrap: Callable[[torch.nn.Module], torch.nn.Module] = no_wrap,
    ) -> list[dict]:
        """Build modules this objective trains besides the policy (a critic); returns their
        optimizer parameter groups. ``wrap`` (``training.distributed.wrap_module``) makes a
        module reduce its gradients over ranks: call the module it returns, and take the
        parameters after wrapping (FSDP2 replaces them by sharded ones)."""
        return []

    def modules(self) -> dict[str, torch.nn.Module]:
        """The modules ``attach`` built, by name (the plain modules, not their wrappers): a
        sharded checkpoint saves them beside the policy."""
        return {}

    def state_dict(self) -> dict | None:
        """Weights of the modules ``attach`` built, for a checkpoint (None: nothing)."""
        return None

    def load_state_dict(self, state: dict | None) -> None:
        if state is not None:
            raise ValueError(f"objective {self.name!r} has no state, the checkpoint has some")

    # ------------------------------------------------------------------ the step
    def needs(self) -> Needs:
        a = self.cfg.algo
        reused = a.epochs_per_batch > 1 or a.minibatches > 1
        return Needs(reference=a.beta > 0, old_logp=reused or a.correction() is not None)

    def prepare(self, batch: RolloutBatch) -> dict[str, float]:
        """Fill ``batch.advantages`` (and ``batch.seq``/``batch.tok``) for ``loss``; returns
        statistics for the step's metrics."""
        raise NotImplementedError

    def micro_batches(self, indices: list[int], batch: RolloutBatch) -> list[list[int]]:
        """How the sequences ``indices`` of one minibatch are cut into forward/backward passes:
        by default grouped by length (less padding: docs/performance.md), or by prompt where
        running each prompt once (``algo.share_prompt``) makes that cheaper."""
        a = self.cfg.algo
        g = batch.group_size
        shared = a.share_prompt and batch.vision is None  # vision inputs run whole
        return length_micro_batches(
            indices,
            [len(p) for p in batch.seq_prompt_ids],
            [len(c) for c in batch.comp_ids],
            a.micro_batch_size,
            a.micro_batch_tokens,
            prompt_keys=[i // g for i in range(batch.size)] if shared else None,
        )

    def active_groups(self, batch: RolloutBatch, indices: list[int]) -> int:
        """Groups among ``indices`` that a group-level loss averages over (0: none is used)."""
        return 0

    def forward(self, model: torch.nn.Module, sb: SequenceBatch) -> dict[str, torch.Tensor]:
        """The update's and the no-grad passes' forward: ``policy``, the ``PolicyOutputs`` the
        log-probs are read from (``algo.logprob_chunk_tokens``: the hidden states a chunk at a
        time, or the full logits), and ``values`` for a critic."""
        chunk = self.cfg.algo.logprob_chunk_tokens
        return {"policy": policy_outputs(model, sb, chunk_tokens=chunk)[0]}

    def loss(self, mb: MicroBatch, counts: MinibatchCounts) -> tuple[torch.Tensor, dict]:
        """Loss of one micro-batch, already divided by the minibatch's global denominators:
        the policy term, plus the KL penalty (``algo.kl_mode=loss``) and the entropy bonus."""
        a = self.cfg.algo
        max_len = self.cfg.completion_tokens()  # an episode: rollout.max_episode_tokens
        denom = counts.for_mode(self.agg_mode)
        loss, stats = self.policy_term(mb, counts)
        stats["policy_loss"] = float(loss.detach())
        if mb.ref_logp is not None:
            kl = kl_estimate(mb.logp, mb.ref_logp, a.kl_estimator)
            stats["kl"] = float((kl.detach() * mb.mask).sum() / mb.mask.sum().clamp(min=1))
            if a.kl_mode == "loss" and mb.kl_coef > 0:
                agg = aggregate(kl, mb.mask, self.agg_mode, max_len=max_len, denominator=denom)
                loss = loss + mb.kl_coef * agg
        if a.entropy_coef:
            # maximise entropy (arXiv 1707.06347, eq. 9): mb.entropy carries its gradient
            ent = aggregate(mb.entropy, mb.mask, self.agg_mode, max_len=max_len, denominator=denom)
            loss = loss - a.entropy_coef * ent
        return loss, stats

    def policy_term(self, mb: MicroBatch, counts: MinibatchCounts) -> tuple[torch.Tensor, dict]:
        """The clipped surrogate (arXiv 1707.06347) with clip-higher and dual clip."""
        a = self.cfg.algo
        loss, stats = policy_loss(
            mb.logp,
            mb.old_logp,
            mb.advantages,
            mb.mask,
            clip_low=a.clip_low,
            clip_high=a.clip_high,
            dual_clip=a.dual_clip,
            log_ratio_clamp=a.log_ratio_clamp,
            agg_mode=self.agg_mode,
            max_len=self.cfg.completion_tokens(),
            denominator=counts.for_mode(self.agg_mode),
            is_weights=mb.tok.get("tis_weights"),
        )
        return loss, dict(stats)


def ratio_diagnostics(mb: MicroBatch, log_ratio_clamp: float) -> dict[str, float]:
    """The token-ratio statistics every objective logs, without PPO's clip fractions: for an
    objective that clips otherwise (GSPO's sequence ratio, CISPO's weight) they would describe a
    clip it does not apply; its own clip fraction is in its loss's statistics."""
    tok = ratio_stats(mb.logp, mb.old_logp, mb.advantages, mb.mask, log_ratio_clamp=log_ratio_clamp)
    for k in ("clip_frac_low", "clip_frac_high", "dual_clip_frac"):
        tok.pop(k)
    return tok


def build_objective(cfg: Config, tokenizer=None) -> Objective:
    """The objective ``cfg.algo.objective`` names, built for this run."""
    return OBJECTIVES[cfg.algo.objective](cfg, tokenizer)
