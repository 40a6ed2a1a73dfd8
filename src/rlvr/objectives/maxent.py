"""Listwise maximum-entropy objective (MaxEnt-GRPO): a weighted MLE over each prompt's K
candidates towards pi* ∝ q^(1/(tau+beta)) pi_ref^(beta/(tau+beta)) (`rlvr.algorithms.maxent`)."""

from __future__ import annotations

from rlvr.objectives.base import Objective, register


@register("maxent_listwise")
class MaxEntListwise(Objective):
    whole_groups = True

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
