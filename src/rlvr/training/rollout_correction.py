"""The rollout correction in the step (``algo.rollout_correction``, ``algo.tis_cap``): the weights
`rlvr.algorithms.rollout_correction_weights` gives for the batch's trainer and engine log-probs,
stored per sequence in ``batch.tok["tis_weights"]`` for the objective's policy term, and their
statistics (docs/rollout.md, "Rollout correction")."""

from __future__ import annotations

import torch

from rlvr.algorithms import rollout_correction_weights
from rlvr.config import RolloutCorrectionConfig
from rlvr.objectives.batch import RolloutBatch, pad_rows


def correction_weights(batch: RolloutBatch, rc: RolloutCorrectionConfig) -> dict[str, float]:
    """Fill ``batch.tok["tis_weights"]`` (one ``[len_i]`` tensor per sequence) from
    ``batch.old_logp`` (the trainer's) and ``batch.tok["engine_logp"]``. Returns, over this
    rank's valid sequences' model tokens, ``tis_weight_mean/min/max``, ``tis_truncated_frac`` (share of
    tokens whose ratio, token or sequence, exceeded the cap) and ``tis_masked_frac`` (share of
    tokens masked)."""
    lengths = [len(x) for x in batch.old_logp]
    width = max(1, max(lengths, default=0))
    trainer = pad_rows(batch.old_logp, width)
    engine = pad_rows(batch.tok["engine_logp"], width)
    # the model's tokens only: an episode's environment tokens (loss mask 0) are not the
    # policy's samples, so they take no weight, no part in a sequence's ratio, no statistic
    model = batch.loss_masks
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = model[i][:n].bool()
    w, truncated, masked = rollout_correction_weights(
        trainer, engine, mask, level=rc.level, action=rc.action, cap=rc.cap, low=rc.low
    )
    batch.tok["tis_weights"] = [w[i, :n] for i, n in enumerate(lengths)]
    valid = mask & batch.valid.reshape(-1, 1)
    if not bool(valid.any()):
        return {}
    ws = w[valid]
    return {
        "tis_weight_mean": float(ws.mean()),
        "tis_weight_min": float(ws.min()),
        "tis_weight_max": float(ws.max()),
        "tis_truncated_frac": float(truncated[valid].float().mean()),
        "tis_masked_frac": float(masked[valid].float().mean()),
    }
