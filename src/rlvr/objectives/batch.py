"""One rollout batch as the step's phases fill it, and the micro-batch views the update cuts from it.

Sequences are in group-major order: sequence ``i`` is sample ``i % G`` of prompt ``i // G``.
Everything an objective prepares is stored per sequence (``seq`` for one value per sequence,
``tok`` for one tensor per sequence over its tokens) and a micro-batch gathers exactly its own
rows by index, so no objective can apply one group's values to another group's sequences
whatever order the shuffled minibatches put them in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlvr.data.multimodal import PromptVision, collate_vision
from rlvr.model.forward import SequenceBatch, build_sequence_batch
from rlvr.rewards.runner import BatchRewards
from rlvr.rollout.base import Completion


@dataclass
class RolloutBatch:
    """What one step generated and everything computed from it before the update."""

    rows: list[dict]  # this rank's prompt rows
    prompt_texts: list[str]  # per prompt
    prompt_ids: list[list[int]]  # per prompt
    groups: list[list[Completion]]  # groups[p][j]: prompt p's j-th sample
    group_size: int
    rewards: BatchRewards | None = None
    scores: torch.Tensor | None = None  # [P, G], invalid entries 0 (after any KL reward penalty)
    valid: torch.Tensor | None = None  # [P, G] bool
    # log-prob phase: one [len_i] tensor per sequence (None when the objective did not need it)
    old_logp: list[torch.Tensor] | None = None
    ref_logp: list[torch.Tensor] | None = None
    values: list[torch.Tensor] | None = None
    # prepare phase: the advantage the loss uses ([N] per sequence, or one [len_i] per sequence)
    advantages: torch.Tensor | list[torch.Tensor] | None = None
    seq: dict[str, torch.Tensor] = field(default_factory=dict)  # other per-sequence fields [N, ...]
    tok: dict[str, list[torch.Tensor]] = field(default_factory=dict)  # other per-token fields
    # per prompt: its images and pixel inputs (None for text prompts); generation and every
    # log-prob pass of the step feed the same ones
    vision: list[PromptVision] | None = None

    @property
    def completions(self) -> list[Completion]:
        return [c for grp in self.groups for c in grp]

    @property
    def seq_prompt_ids(self) -> list[list[int]]:
        return [p for p in self.prompt_ids for _ in range(self.group_size)]

    @property
    def seq_prompt_texts(self) -> list[str]:
        return [p for p in self.prompt_texts for _ in range(self.group_size)]

    @property
    def seq_vision(self) -> list[PromptVision] | None:
        if self.vision is None:
            return None
        return [v for v in self.vision for _ in range(self.group_size)]

    def sequence_batch(
        self,
        indices: list[int],
        pad_id: int,
        image_token_id: int | None = None,
        *,
        share_prompt: bool = False,
        device: torch.device | str | None = None,
    ) -> SequenceBatch:
        """Sequences ``indices`` laid out for one forward pass, with their prompts' images;
        ``share_prompt``: rows with the same prompt run it once (``build_sequence_batch``);
        ``device``: where the model runs (the batch itself stays on the CPU)."""
        prompts, comps = self.seq_prompt_ids, self.comp_ids
        vision = self.seq_vision
        sb = build_sequence_batch(
            [prompts[i] for i in indices],
            [comps[i] for i in indices],
            pad_id,
            vision=collate_vision([vision[i] for i in indices]) if vision else None,
            image_token_id=image_token_id,
            share_prompt=share_prompt,
        )
        return sb if device is None else sb.to(device)

    @property
    def comp_ids(self) -> list[list[int]]:
        return [c.token_ids for c in self.completions]

    @property
    def size(self) -> int:
        return len(self.prompt_ids) * self.group_size

    @property
    def loss_masks(self) -> list[torch.Tensor]:
        """Per sequence ``[len_i]``: 1 at the model's tokens, 0 at an episode's environment
        tokens (rlvr.rollout.episodes); all ones for single-turn replies."""
        return [
            torch.ones(len(c.token_ids))
            if c.loss_mask is None
            else torch.tensor(c.loss_mask, dtype=torch.float32)
            for c in self.completions
        ]

    def model_token_values(
        self, per_seq: list[torch.Tensor], *, valid_only: bool = True
    ) -> torch.Tensor:
        """The values of ``per_seq`` (one ``[len_i]`` tensor per sequence) at the model's tokens
        (loss mask 1) of the valid sequences (``valid_only``), concatenated: the one selection a
        token statistic takes, so an episode's environment tokens never enter a mean."""
        masks = self.loss_masks
        valid = self.valid.reshape(-1).tolist() if valid_only else [True] * len(per_seq)
        parts = [
            v.reshape(-1)[masks[i][: len(v)].bool()]
            for i, v in enumerate(per_seq)
            if valid[i] and len(v)
        ]
        return torch.cat(parts) if parts else torch.zeros(0)

    def model_token_means(self, per_seq: list[torch.Tensor]) -> torch.Tensor:
        """``[N]``: each sequence's mean of ``per_seq`` over its model tokens (0 with none)."""
        masks = self.loss_masks
        out = torch.zeros(len(per_seq))
        for i, v in enumerate(per_seq):
            m = masks[i][: len(v)].bool()
            if bool(m.any()):
                out[i] = v.reshape(-1)[m].float().mean()
        return out

    def token_mask(self) -> torch.Tensor:
        """``[N, T]`` 1 on every model token of the completions (T the longest, at least 1)."""
        ids = self.comp_ids
        return pad_rows(self.loss_masks, max(1, max(map(len, ids))))

    def loss_mask_rows(self, indices: list[int], width: int) -> torch.Tensor | None:
        """``[len(indices), width]`` loss masks of rows ``indices``, or None when they hold
        only model tokens (single-turn replies: the completion mask alone)."""
        comps = self.completions
        if all(comps[i].loss_mask is None for i in indices):
            return None
        masks = self.loss_masks
        return pad_rows([masks[i] for i in indices], width)

    def model_tokens(self, i: int) -> int:
        """Sequence ``i``'s model tokens (what the losses count)."""
        return self.completions[i].model_token_count


@dataclass
class MinibatchCounts:
    """Denominators of a whole minibatch across every rank (valid rows only)."""

    sequences: int
    tokens: int
    active_groups: int = 0

    def for_mode(self, mode: str) -> int:
        return max(1, self.tokens if mode == "token_mean" else self.sequences)


@dataclass
class MicroBatch:
    """One forward/backward pass: rows ``indices`` of the batch. Token tensors are ``[B, T]``."""

    indices: list[int]
    logp: torch.Tensor  # with grad
    old_logp: torch.Tensor
    mask: torch.Tensor  # completion tokens of valid sequences
    advantages: torch.Tensor  # [B] or [B, T]
    entropy: torch.Tensor  # with grad when algo.entropy_coef != 0
    kl_coef: float = 0.0
    ref_logp: torch.Tensor | None = None
    values: torch.Tensor | None = None  # the critic's forward, with grad (PPO)
    seq: dict[str, torch.Tensor] = field(default_factory=dict)
    tok: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Everything the step prepared on the CPU (old and reference log-probs, advantages,
        per-sequence and per-token fields) moves to where the forward ran (``logp``'s device),
        so an objective's loss never mixes devices."""
        device = self.logp.device

        def move(t):
            return t if t is None or t.device == device else t.to(device, non_blocking=True)

        self.old_logp, self.mask = move(self.old_logp), move(self.mask)
        self.advantages, self.ref_logp = move(self.advantages), move(self.ref_logp)
        self.seq = {k: move(v) for k, v in self.seq.items()}
        self.tok = {k: move(v) for k, v in self.tok.items()}


def gather_micro_batch(
    batch: RolloutBatch, indices: list[int], width: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The advantages and prepared fields of rows ``indices``, token fields padded to ``width``."""
    adv = batch.advantages
    if isinstance(adv, torch.Tensor):
        advantages = adv[indices]
    else:
        advantages = pad_rows([adv[i] for i in indices], width)
    seq = {k: v[indices] for k, v in batch.seq.items()}
    tok = {k: pad_rows([v[i] for i in indices], width) for k, v in batch.tok.items()}
    return advantages, seq, tok


def pad_rows(rows: list[torch.Tensor | None], width: int) -> torch.Tensor:
    """Stack 1-D float rows of different lengths into ``[len(rows), width]``, zero-padded."""
    out = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        if r is not None and len(r):
            out[i, : len(r)] = r[:width].float()
    return out
