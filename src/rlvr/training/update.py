"""The update phase: minibatches of whole prompt groups, micro-batches cut by the objective,
global denominators, gradient clipping, and no update ever applied from a non-finite loss or
gradient. Nothing here depends on which objective runs: it only calls the objective's methods.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from rlvr.distributed import all_gather_objects, all_reduce_sum
from rlvr.objectives.batch import (
    MicroBatch,
    MinibatchCounts,
    RolloutBatch,
    gather_micro_batch,
    pad_rows,
)
from rlvr.training.batching import group_minibatches
from rlvr.training.preempt import StopSignals
from rlvr.training.setup import Run
from rlvr.training.state import TrainState
from rlvr.training.step_metrics import summarize_update_stats


def update(
    batch: RolloutBatch, state: TrainState, run: Run, stops: StopSignals | None = None
) -> tuple[dict, list]:
    """Train on ``batch``; returns (metrics, per-sequence trainer-minus-engine log-prob
    differences when the update's own forward is the trainer's only log-prob pass).

    ``stops`` (several ranks): a rank whose stop-signal grace ran out says so in each
    minibatch's sum over ranks, and every rank leaves the update there (training/preempt)."""
    cfg, a, objective = run.cfg, run.cfg.algo, run.objective
    g, n = batch.group_size, batch.size
    comp_ids, comps = batch.comp_ids, batch.completions
    valid = batch.valid.reshape(-1)
    temperature = run.temperature
    use_old = objective.needs().old_logp  # else old == current policy (one pass over the batch)
    opt = state.optimizer
    stats: list[dict] = []
    entropies: list[torch.Tensor] = []
    grad_norms: list[float] = []
    diffs: list[torch.Tensor] = []
    skipped = applied = 0
    state.model.train()
    for epoch in range(a.epochs_per_batch):
        shuffle = None if a.minibatches == 1 else cfg.train.seed * 7919 + state.step * 31 + epoch
        for mb in group_minibatches(n // g, g, a.minibatches, shuffle_seed=shuffle):
            mb_valid = [i for i in mb if valid[i]]
            local = [
                len(mb_valid),
                sum(batch.model_tokens(i) for i in mb_valid),
                objective.active_groups(batch, mb),
                float(stops is not None and stops.grace_over),
            ]
            seqs, toks, act, over = all_reduce_sum(local, run.dist)  # denominators: every rank
            if over:  # a rank's grace ran out: all leave the update here, together
                stops.abandon_update(run.dist)
            counts = MinibatchCounts(sequences=int(seqs), tokens=int(toks), active_groups=int(act))
            opt.zero_grad(set_to_none=True)
            first = len(stats)  # this minibatch's micro-batch statistics start here
            for idx in objective.micro_batches(mb, batch):
                sb = batch.sequence_batch(
                    idx,
                    run.pad_id,
                    run.image_token_id,
                    share_prompt=a.share_prompt,
                    device=run.device,
                )
                with run.autocast_context():
                    out = objective.forward(run.train_model, sb)
                logp, ent = out["policy"].logprobs(
                    sb, temperature, entropy_grad=a.entropy_coef != 0
                )
                # full path: the logits are not needed by the backward (log_softmax keeps its
                # output): dropped here, they are not held through it
                del out["policy"]
                if batch.old_logp is None and epoch == 0:
                    diffs += engine_diffs(logp.detach(), idx, comp_ids, comps)
                row_valid = valid[idx].float().unsqueeze(1).to(sb.completion_mask.device)
                mask = sb.completion_mask * row_valid
                width = mask.shape[1]
                env_mask = batch.loss_mask_rows(idx, width)  # an episode's environment tokens: 0
                if env_mask is not None:
                    mask = mask * env_mask.to(mask.device)
                old = pad_rows([batch.old_logp[i] for i in idx], width) if use_old else None
                advantages, seq, tok = gather_micro_batch(batch, idx, width)
                micro = MicroBatch(
                    indices=idx,
                    logp=logp,
                    old_logp=old if old is not None else logp.detach(),
                    mask=mask,
                    advantages=advantages,
                    entropy=ent,
                    kl_coef=state.kl_ctl.value,
                    ref_logp=pad_rows([batch.ref_logp[i] for i in idx], width)
                    if batch.ref_logp is not None
                    else None,
                    values=out.get("values"),
                    seq=seq,
                    tok=tok,
                )
                loss, st = objective.loss(micro, counts)
                if torch.isfinite(loss):
                    # FSDP/DDP average gradients over ranks; scaling by the world size makes
                    # that average the sum that global denominators expect.
                    (loss * run.dist.world_size).backward()
                else:
                    st["nonfinite_loss"] = 1.0
                stats.append(st)
                entropies.append(ent.detach()[mask.bool()])
            gn = torch.nn.utils.clip_grad_norm_(state.trainable_params(), cfg.train.max_grad_norm)
            gn = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)
            if not math.isfinite(gn) or any(s.get("nonfinite_loss") for s in stats[first:]):
                skipped += 1  # never apply a non-finite update
            else:
                opt.step()
                applied += 1
            # free the gradients now rather than through the next rollout (~4 bytes/param)
            opt.zero_grad(set_to_none=True)
            grad_norms.append(gn)
    state.scheduler.step()
    if applied:
        state.policy_version += 1
    if run.dist.enabled:  # pool every rank's micro-batch statistics and entropies
        gathered = all_gather_objects((stats, [e.tolist() for e in entropies]), run.dist)
        stats = [st for part, _ in gathered for st in part]
        entropies = [torch.tensor(e) for _, ents in gathered for e in ents]
    kl_values = [s["kl"] for s in stats if "kl" in s]
    if kl_values:
        # Adaptive KL (Ziegler et al. 2019, arXiv 1909.08593): the horizon counts samples, so
        # the controller moves by the number of sequences this step trained on, every rank's.
        state.kl_ctl.update(float(np.mean(kl_values)), n_steps=n * run.dist.world_size)
    metrics = summarize_update_stats(stats, entropies, grad_norms)
    metrics["nonfinite_skipped"] = float(skipped > 0)
    return metrics, diffs


def engine_diffs(trainer_logp: torch.Tensor, idx: list[int], comp_ids, comps) -> list[torch.Tensor]:
    """Per-sequence trainer-minus-engine log-prob differences of the sampled tokens (an
    episode's model tokens only: the environment's were not sampled)."""
    out = []
    trainer_logp = trainer_logp.detach().float().cpu()  # the engine's log-probs are on the CPU
    for row, i in enumerate(idx):
        length = len(comp_ids[i])
        if length:
            engine = torch.tensor(comps[i].logprobs[:length])
            diff = trainer_logp[row, :length].float() - engine
            if comps[i].loss_mask is not None:
                diff = diff[torch.tensor(comps[i].loss_mask[:length], dtype=torch.bool)]
            if len(diff):
                out.append(diff)
    return out
