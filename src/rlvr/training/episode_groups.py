"""Agents' episodes that split into several sequences (rlvr.rollout.agents) in a step's batch.

The batch holds every sequence, each row's episodes padded with empty fillers to one width that
every rank shares (DDP ranks must run as many micro-batches). The group is the row's episodes:
the objective computes its advantages over the sequences that stand for the episodes (each
episode's last), and each earlier sequence of an episode takes its episode's advantage; every
sequence carries the episode's reward. Only sequence-level advantages can be shared so (the
config allows agents with the group objectives only: rlvr.config.env). Reward and episode
metrics count episodes, not sequences.
"""

from __future__ import annotations

import torch

from rlvr.distributed import all_gather_objects
from rlvr.objectives.batch import RolloutBatch
from rlvr.rewards.runner import BatchRewards
from rlvr.rollout.agents import expand_sequences
from rlvr.rollout.base import Completion


def lay_out(
    groups: list[list[Completion]], dist
) -> tuple[list[list[Completion]], list[int] | None]:
    """Every sequence of the groups' episodes (``expand_sequences``), at one width over ranks."""
    need = max((sum(1 + len(c.episode.earlier) for c in g) for g in groups), default=0)
    width = need
    if dist.enabled:
        width = max(all_gather_objects(need, dist))
    return expand_sequences(groups, width)


def episode_view(batch: RolloutBatch, rewards: BatchRewards):
    """(scores [P, G], valid [P, G], completions, rewards) of the sequences standing for the
    episodes, for the step's metrics; the batch's own where nothing split."""
    if batch.episode_of is None:
        return batch.scores, batch.valid, batch.completions, rewards
    keep = [i for i, e in enumerate(batch.episode_of) if e == i]
    p = len(batch.prompt_ids)
    comps = batch.completions
    pick = BatchRewards(
        scores=[rewards.scores[i] for i in keep],
        infos=[rewards.infos[i] for i in keep],
        valid=[rewards.valid[i] for i in keep],
        failures=[f for f in rewards.failures],
    )
    flat_s, flat_v = batch.scores.reshape(-1), batch.valid.reshape(-1)
    return flat_s[keep].view(p, -1), flat_v[keep].view(p, -1), [comps[i] for i in keep], pick


def mask_fillers(batch: RolloutBatch) -> None:
    """Fillers are never valid (no tokens, no episode)."""
    if batch.episode_of is None:
        return
    flat = batch.valid.reshape(-1).clone()
    flat[torch.tensor([e < 0 for e in batch.episode_of])] = False
    batch.valid = flat.view_as(batch.valid)
    batch.scores = torch.where(batch.valid, batch.scores, torch.zeros_like(batch.scores))


def episode_sums(batch: RolloutBatch, values: torch.Tensor) -> torch.Tensor:
    """``values`` ``[P, G]`` (one per sequence) with each episode's sequences given the sum over
    them: a per-token quantity summed over a sequence (the KL that ``algo.kl_mode=reward`` takes
    from the reward) sums over the episode's model tokens, in whichever sequence they lie."""
    if batch.episode_of is None:
        return values
    flat = values.reshape(-1)
    of = torch.tensor(batch.episode_of)
    live = of >= 0
    total = torch.zeros_like(flat).index_add_(0, of[live], flat[live])
    return torch.where(live, total[of.clamp(min=0)], flat).view_as(values)


def prepare_by_episode(batch: RolloutBatch, prepare) -> dict:
    """``prepare(batch)`` (the objective's) over the episodes' own sequences, then each earlier
    sequence given its episode's advantage."""
    if batch.episode_of is None:
        return prepare(batch)
    of = torch.tensor(batch.episode_of)
    index = torch.arange(len(of))
    valid = batch.valid
    batch.valid = (valid.reshape(-1) & (of == index)).view_as(valid)
    try:
        stats = prepare(batch)
    finally:
        batch.valid = valid
    adv = batch.advantages
    if not isinstance(adv, torch.Tensor) or adv.dim() != 1:
        raise ValueError(
            "an agent's episode split into several sequences needs one advantage per sequence "
            "(algo.objective drgrpo, grpo, rloo, gspo or cispo)"
        )
    src = torch.where(of >= 0, of, index)
    batch.advantages = torch.where(of >= 0, adv[src], torch.zeros_like(adv))
    return stats
