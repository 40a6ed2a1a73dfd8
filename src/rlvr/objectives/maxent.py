"""Listwise maximum-entropy objective (MaxEnt-GRPO): a weighted MLE over each prompt's K
candidates towards pi* ∝ q^(1/(tau+beta)) pi_ref^(beta/(tau+beta)) (`rlvr.algorithms.maxent`).

The listwise weights are computed once per batch (``prepare``) and stored per sequence, so a
micro-batch gathers its own groups' weights whatever order the shuffled minibatch is in.
"""

from __future__ import annotations

import torch

from rlvr.algorithms import (
    active_groups,
    maxent_clip_term,
    maxent_listwise_loss,
    maxent_weights,
    ratio_stats,
    sequence_logp,
)
from rlvr.objectives.base import Objective, register
from rlvr.objectives.batch import MicroBatch, MinibatchCounts, RolloutBatch, pad_rows
from rlvr.objectives.micro_batches import micro_batches


@register("maxent_listwise")
class MaxEntListwise(Objective):
    supports_tis = False  # a listwise MLE over sequences, no per-token policy-gradient term

    @classmethod
    def check(cls, cfg) -> list[str]:
        a, m = cfg.algo, cfg.algo.maxent
        k = a.group_size
        out = []
        if a.loss_agg not in ("auto", "seq_mean_token_sum_norm"):
            out.append(
                "algo.objective=maxent_listwise requires the Dr.GRPO critic setting "
                f"(algo.loss_agg auto or seq_mean_token_sum_norm), got {a.loss_agg!r}"
            )
        if a.micro_batch_size % max(k, 1):
            out.append(
                f"algo.micro_batch_size={a.micro_batch_size} must be divisible by algo.group_size={k} "
                "for maxent_listwise (each micro-batch holds whole prompt groups)"
            )
        if m.tau <= 0:
            out.append(f"algo.maxent.tau={m.tau}: must be > 0")
        if a.micro_batch_tokens is not None:
            out.append(
                "algo.micro_batch_tokens is not used by maxent_listwise (its micro-batches hold "
                "whole prompt groups of algo.micro_batch_size sequences); leave it unset"
            )
        if m.q_temperature <= 0:
            out.append(f"algo.maxent.q_temperature={m.q_temperature}: must be > 0")
        if k > 1 and not (0 < m.q_eps < 1.0 / k):
            out.append(f"algo.maxent.q_eps={m.q_eps}: must be in (0, 1/K) = (0, {1.0 / k:.4g})")
        return out

    def prepare(self, batch: RolloutBatch) -> dict[str, float]:
        a, m = self.cfg.algo, self.cfg.algo.maxent
        k = batch.group_size
        scores = batch.scores
        if a.beta > 0:
            mask = batch.token_mask()
            ref = pad_rows(batch.ref_logp, mask.shape[1])
            ref_seq = sequence_logp(ref, mask, m.length_normalize_ref).view(-1, k)
        else:
            ref_seq = torch.zeros_like(scores)
        _, w = maxent_weights(scores, ref_seq, m.tau, a.beta, m.q_temperature, m.q_eps)
        active = (
            active_groups(scores)
            if m.skip_zero_variance_groups
            else torch.ones(scores.shape[0], dtype=torch.bool)
        )
        active = active & batch.valid.all(dim=1)
        batch.seq["weights"] = w.reshape(-1)
        batch.seq["active"] = active.repeat_interleave(k)
        # The advantage the clip term uses for each candidate: its weight above uniform.
        batch.advantages = (w - 1.0 / k).reshape(-1)
        return {}

    def micro_batches(self, indices: list[int], batch: RolloutBatch) -> list[list[int]]:
        """Whole groups, in the minibatch's order: the listwise loss needs all K candidates."""
        return micro_batches(indices, self.cfg.algo.micro_batch_size)

    def active_groups(self, batch: RolloutBatch, indices: list[int]) -> int:
        return int(batch.seq["active"][indices[:: batch.group_size]].sum())

    def policy_term(self, mb: MicroBatch, counts: MinibatchCounts) -> tuple[torch.Tensor, dict]:
        a, m = self.cfg.algo, self.cfg.algo.maxent
        k = a.group_size
        seq = sequence_logp(mb.logp, mb.mask, m.length_normalize_policy).view(-1, k)
        weights = mb.seq["weights"].view(-1, k)
        active = mb.seq["active"].view(-1, k)[:, 0]
        n_active = int(active.sum())
        # maxent_listwise_loss averages over this micro-batch's active groups; rescale to the
        # minibatch's so the micro-batch losses sum to the minibatch loss.
        scale = n_active / max(1, counts.active_groups)
        loss = maxent_listwise_loss(seq, weights, active) * scale
        stats = {
            "maxent_listwise_loss": float(loss.detach()),
            "maxent_active_groups": float(n_active),
        }
        if m.use_clip_objective:
            old = sequence_logp(mb.old_logp, mb.mask, m.length_normalize_policy).view(-1, k)
            clip = maxent_clip_term(
                seq, old, weights, active, a.clip_low, a.clip_high, a.log_ratio_clamp
            )
            loss = loss + m.clip_objective_coef * clip * scale
            stats["maxent_clip_term"] = float(clip.detach())
        # the same ratio diagnostics as the other objectives, with the clip term's advantage
        stats.update(
            ratio_stats(
                mb.logp,
                mb.old_logp,
                mb.advantages,
                mb.mask,
                clip_low=a.clip_low,
                clip_high=a.clip_high,
                log_ratio_clamp=a.log_ratio_clamp,
            )
        )
        return loss, stats
