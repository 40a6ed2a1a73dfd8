"""DAPO dynamic sampling (arXiv 2503.14476, section 3.2): a group whose replies are all right or
all wrong has no group-relative signal worth a gradient, so the step keeps drawing fresh prompts
until it holds ``algo.prompts_per_step`` groups whose correctness differs (at most
``algo.dynamic_sampling_max_rounds`` rounds of generation).

What must differ (``algo.dynamic_sampling_metric``): ``accuracy`` (default), the verifier's
correctness, as DAPO's paper and verl's ``filter_groups`` (metric ``acc``) filter; or ``score``,
the shaped reward. The two part ways under DAPO's overlong penalty: an all-correct group of
different lengths has different scores but one accuracy, and DAPO drops it.

If the rounds run out first, the batch is filled up with equal-reward groups (they add no
gradient to group-relative objectives) so that every step trains on the same number of groups.
"""

from __future__ import annotations

import torch

from rlvr.data.multimodal import PromptVision
from rlvr.objectives.batch import RolloutBatch
from rlvr.rewards.runner import BatchRewards


def filter_values(batch: RolloutBatch, metric: str) -> torch.Tensor:
    """``[P, G]``: what dynamic sampling compares within a group. ``score``: the shaped scores
    (``batch.scores``). ``accuracy``: the verifier's correctness, each reply's ``correct`` info
    (the key the built-in graders report and the ``correct`` metric averages); a reward that
    reports none counts by its own score before any shaping (``batch.rewards.scores``: no
    overlong penalty, no KL penalty)."""
    if metric == "score":
        return batch.scores
    if metric != "accuracy":
        raise ValueError(f"algo.dynamic_sampling_metric={metric!r}: use accuracy or score")
    r = batch.rewards
    vals = [
        float(info["correct"]) if "correct" in info else float(score)
        for info, score in zip(r.infos, r.scores, strict=True)
    ]
    return torch.tensor(vals, dtype=torch.float32).view_as(batch.scores)


def informative_groups(scores: torch.Tensor, valid: torch.Tensor) -> list[bool]:
    """Per prompt ``[P]``: True when the group's valid values are not all equal (2+ valid)."""
    out = []
    for row, ok in zip(scores, valid, strict=True):
        r = row[ok]
        out.append(bool(r.numel() >= 2 and float(r.max() - r.min()) > 1e-8))
    return out


def select_groups(batch: RolloutBatch, groups: list[int]) -> RolloutBatch:
    """The scored batch restricted to prompts ``groups`` (in that order); no reward failures
    (the caller keeps those of every round)."""
    g = batch.group_size
    seqs = [p * g + j for p in groups for j in range(g)]
    r = batch.rewards
    return RolloutBatch(
        rows=[batch.rows[p] for p in groups],
        prompt_texts=[batch.prompt_texts[p] for p in groups],
        prompt_ids=[batch.prompt_ids[p] for p in groups],
        groups=[batch.groups[p] for p in groups],
        group_size=g,
        rewards=BatchRewards(
            scores=[r.scores[i] for i in seqs],
            infos=[r.infos[i] for i in seqs],
            valid=[r.valid[i] for i in seqs],
            failures=[],
            errors=[r.error(i) for i in seqs],
        ),
        scores=batch.scores[groups],
        valid=batch.valid[groups],
        vision=None if batch.vision is None else [batch.vision[p] for p in groups],
    )


def concat_batches(parts: list[RolloutBatch], failures: list[str]) -> RolloutBatch:
    """Scored batches (same group size) one after the other, with the given reward failures."""
    g = parts[0].group_size
    return RolloutBatch(
        rows=[x for b in parts for x in b.rows],
        prompt_texts=[x for b in parts for x in b.prompt_texts],
        prompt_ids=[x for b in parts for x in b.prompt_ids],
        groups=[x for b in parts for x in b.groups],
        group_size=g,
        rewards=BatchRewards(
            scores=[x for b in parts for x in b.rewards.scores],
            infos=[x for b in parts for x in b.rewards.infos],
            valid=[x for b in parts for x in b.rewards.valid],
            failures=list(failures),
            errors=[b.rewards.error(i) for b in parts for i in range(len(b.rewards.valid))],
        ),
        scores=torch.cat([b.scores for b in parts]),
        valid=torch.cat([b.valid for b in parts]),
        vision=_concat_vision(parts),
    )


def _concat_vision(parts: list[RolloutBatch]) -> list[PromptVision] | None:
    """Per-prompt vision of the parts in order (a round of text-only prompts: no images)."""
    if all(b.vision is None for b in parts):
        return None
    none = PromptVision([], {})
    return [v for b in parts for v in (b.vision or [none] * len(b.prompt_ids))]


def count_informative(rounds: list[RolloutBatch], metric: str) -> int:
    """Informative groups over the scored ``rounds`` under ``metric``."""
    return sum(sum(informative_groups(filter_values(b, metric), b.valid)) for b in rounds)


def assemble(
    rounds: list[RolloutBatch], need: int, metric: str = "accuracy"
) -> tuple[RolloutBatch, int]:
    """The step's batch of ``need`` groups from the scored ``rounds``: informative groups under
    ``metric`` first (in drawing order), then the others to fill up. Returns (batch,
    informative kept)."""
    good: list[tuple[int, int]] = []
    rest: list[tuple[int, int]] = []
    for k, b in enumerate(rounds):
        for p, ok in enumerate(informative_groups(filter_values(b, metric), b.valid)):
            (good if ok else rest).append((k, p))
    chosen = (good + rest)[:need]
    parts = []
    for k, b in enumerate(rounds):
        idx = sorted(p for kk, p in chosen if kk == k)  # drawing order within a round
        if idx:
            parts.append(select_groups(b, idx))
    failures = [f for b in rounds for f in b.rewards.failures]
    return concat_batches(parts, failures), min(len(good), need)
