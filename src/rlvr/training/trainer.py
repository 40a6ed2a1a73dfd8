"""The training loop: rollout -> rewards -> advantages -> update -> sync -> telemetry -> eval/ckpt.

Nothing else lives here: maths is in `rlvr.algorithms`, losses per objective in `objectives.py`,
log-probs in `policy.py`, metric summaries in `step_metrics.py`.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from pathlib import Path

import numpy as np
import torch

from rlvr.algorithms import (
    AdaptiveKLController,
    FixedKLController,
    active_groups,
    gae_advantages,
    group_advantages,
    maxent_weights,
    sequence_logp,
)
from rlvr.config import Config
from rlvr.data.templates import render_rows
from rlvr.rewards.runner import BatchRewards
from rlvr.rollout.base import Completion, SamplingParams
from rlvr.training.batching import (
    PromptSampler,
    group_minibatches,
    length_micro_batches,
    micro_batches,
)
from rlvr.training.distributed import DistInfo, all_gather_objects, all_reduce_sum
from rlvr.training.objectives import MicroBatch, MinibatchCounts, micro_loss
from rlvr.training.policy import build_sequence_batch, completion_logits, logprobs_and_entropy
from rlvr.training.run_setup import RunContext, setup_run
from rlvr.training.step_metrics import rollout_metrics, summarize_update_stats

GROUP_ADV_METHODS = {
    "drgrpo": "drgrpo",
    "grpo": "grpo",
    "rloo": "rloo",
    "maxent_listwise": "drgrpo",
}


class Trainer:
    """One RL fine-tuning run. ``Trainer(cfg).fit()`` returns a summary dict.

    Pass ``model``/``tokenizer`` to train an already-loaded model (notebooks, tests).
    """

    def __init__(self, cfg: Config, *, model=None, tokenizer=None, run_dir: Path | None = None):
        self.cfg = cfg.validate()
        self.ctx: RunContext = setup_run(cfg, model=model, tokenizer=tokenizer, run_dir=run_dir)
        c = self.ctx
        self.model, self.tokenizer, self.engine = c.model, c.tokenizer, c.engine
        self.dist: DistInfo = getattr(c, "dist", None) or DistInfo()
        self.sampler = PromptSampler(
            len(c.train_rows), cfg.algo.prompts_per_step, seed=cfg.train.seed
        )
        self.train_model = c.train_model or self.model
        self.ref_model = c.ref_model
        self.kl_ctl = (
            AdaptiveKLController(cfg.algo.beta, cfg.algo.kl_target, cfg.algo.kl_horizon)
            if cfg.algo.kl_target is not None
            else FixedKLController(cfg.algo.beta)
        )
        self.step_scorer = None
        if cfg.algo.objective == "psgrpo_steps":
            from rlvr.rewards.registry import build_prm
            from rlvr.training.psgrpo_steps import StepScorer

            ps = cfg.algo.psgrpo
            prm = (
                build_prm(ps.prm)
                if ":" in ps.prm
                else build_prm(ps.prm, tag_token=ps.tag_token, label_index=ps.label_index)
            )
            self.step_scorer = StepScorer(prm, ps.step_pattern, ps.answer_pattern)
        self.step = 0
        self.history: list[dict] = []

    # ------------------------------------------------------------------ helpers
    def _autocast(self):
        if not self.ctx.autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.ctx.device.type, dtype=torch.bfloat16)

    def _seed_step(self, step: int) -> int:
        seed = self.cfg.train.seed * 1_000_003 + step
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        return seed

    # ------------------------------------------------------------------ one step
    def train_step(self) -> dict:
        cfg, a = self.cfg, self.cfg.algo
        g = a.group_size
        timings: dict[str, float] = {}
        t_step = time.perf_counter()
        seed = self._seed_step(self.step)

        # Every rank draws the same global prompts and keeps its own slice of whole prompts.
        global_idx = self.sampler.next_indices()
        per = len(global_idx) // self.dist.world_size
        lo = self.dist.rank * per
        rows = [self.ctx.train_rows[i] for i in global_idx[lo : lo + per]]
        # every row's prompt length was checked before the first step (run_setup)
        d = cfg.data
        prompt_texts, prompt_ids = render_rows(rows, d.template, self.tokenizer, d.system_prompt)

        t = time.perf_counter()
        params = SamplingParams(
            n=g,
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            top_k=cfg.rollout.top_k,
            max_new_tokens=cfg.rollout.max_new_tokens,
            stop=tuple(cfg.rollout.stop),
            seed=seed + 7919 * self.dist.rank,
            prompt_seeds=tuple(seed * 4099 + lo + j for j in range(len(rows)))
            if cfg.rollout.seed_per_prompt
            else None,
        )
        groups = self.engine.generate(prompt_ids, params)
        comps: list[Completion] = [c for grp in groups for c in grp]
        timings["time_rollout"] = time.perf_counter() - t

        t = time.perf_counter()
        flat_rows = [r for r in rows for _ in range(g)]
        rewards = self.ctx.rewards.score_batch(
            [p for p in prompt_texts for _ in range(g)],
            [c.text for c in comps],
            [r["answer"] for r in flat_rows],
            flat_rows,
            [c.truncated for c in comps],
        )
        timings["time_reward"] = time.perf_counter() - t
        scores = torch.tensor(rewards.scores, dtype=torch.float32).view(-1, g)
        valid = torch.tensor(rewards.valid, dtype=torch.bool).view(-1, g)
        scores = torch.where(valid, torch.nan_to_num(scores), torch.zeros_like(scores))

        seq_prompt_ids = [p for p in prompt_ids for _ in range(g)]
        seq_comp_ids = [c.token_ids for c in comps]
        metrics = self._global_rollout_metrics(scores, valid, comps, rewards)

        if cfg.rollout.sleep_during_update and hasattr(self.engine, "sleep"):
            self.engine.sleep()  # GPU: free the engine's memory for the update (wakes on sync)
        lr_used = self.ctx.scheduler.get_last_lr()[0]
        t = time.perf_counter()
        seq_prompts = [p for p in prompt_texts for _ in range(g)]
        update_stats = self._update(seq_prompt_ids, seq_comp_ids, comps, scores, valid, seq_prompts)
        timings["time_update"] = time.perf_counter() - t - update_stats.pop("_time_reference", 0.0)
        timings["time_reference"] = update_stats.pop("_time_reference_total", 0.0)

        t = time.perf_counter()
        if self.engine.name != "hf" and (self.step + 1) % cfg.rollout.sync_every == 0:
            self.engine.load_weights(self.ctx.named_weights())
        timings["time_sync"] = time.perf_counter() - t

        metrics.update(update_stats)
        metrics.update(timings)
        metrics["time_step"] = time.perf_counter() - t_step
        gen_tokens = sum(len(c.token_ids) for c in comps) * self.dist.world_size
        metrics["gen_tokens_per_s"] = gen_tokens / max(timings["time_rollout"], 1e-9)
        metrics["train_tokens_per_s"] = (
            gen_tokens * a.epochs_per_batch / max(timings["time_update"], 1e-9)
        )
        metrics["lr"] = lr_used
        metrics["epoch"] = self.sampler.epoch
        if self.ref_model is not None or a.beta > 0:
            metrics["kl_coef"] = self.kl_ctl.value
        self._last_batch = (prompt_texts, rows, groups, rewards)
        return metrics

    # ------------------------------------------------------------------ update
    def _update(self, prompt_ids, comp_ids, comps, scores, valid, prompt_texts) -> dict:
        cfg, a = self.cfg, self.cfg.algo
        g, n = a.group_size, len(comp_ids)
        pad = self.tokenizer.pad_token_id
        temp = cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0
        valid_flat = valid.view(-1)
        need_old = a.epochs_per_batch > 1 or a.minibatches > 1
        need_ref = a.beta > 0  # KL (loss or reward) and maxent's reference term

        t_ref = 0.0

        # Pass 1 (no grad), only when needed: old log-probs when the batch is used more than once,
        # reference log-probs when KL or maxent's beta needs them (and the trust check from them).
        old_logp: list[torch.Tensor] = [None] * n  # type: ignore[list-item]
        ref_logp: list[torch.Tensor] = [None] * n  # type: ignore[list-item]
        old_values: list[torch.Tensor] = [None] * n  # type: ignore[list-item]
        diffs: list[torch.Tensor] = []
        # With one update per batch and no reference, the update's own forward gives the
        # trainer log-probs for the trust check: no extra pass.
        need_pass1 = need_old or need_ref
        with torch.no_grad():
            for idx in (
                self._micro_batches(list(range(n)), prompt_ids, comp_ids) if need_pass1 else []
            ):
                sb = build_sequence_batch(
                    [prompt_ids[i] for i in idx], [comp_ids[i] for i in idx], pad
                )
                with self._autocast():
                    logits = completion_logits(self.model, sb)
                lp, _ = logprobs_and_entropy(
                    _scaled(logits, temp), sb.completion_ids, entropy=False
                )
                for row, i in enumerate(idx):
                    old_logp[i] = lp[row, : len(comp_ids[i])]
                diffs += _engine_diffs(lp, idx, comp_ids, comps)
                if need_ref:
                    t0 = time.perf_counter()
                    ref = self._reference_logp(sb, temp)
                    for row, i in enumerate(idx):
                        ref_logp[i] = ref[row, : len(comp_ids[i])]
                    t_ref += time.perf_counter() - t0
        stats_out: dict[str, float] = {}

        # KL as a reward penalty folds into the scalar reward before advantages.
        if a.kl_mode == "reward" and need_ref and self.kl_ctl.value > 0:
            pen = torch.tensor(
                [
                    float((old_logp[i] - ref_logp[i]).sum()) if len(comp_ids[i]) else 0.0
                    for i in range(n)
                ]
            ).view(-1, g)
            scores = scores - self.kl_ctl.value * pen

        adv_tokens = None
        if a.objective == "psgrpo_steps":
            adv_tokens, step_stats = self._psgrpo_step_advantages(
                prompt_texts, comps, comp_ids, scores, valid
            )
            stats_out.update(step_stats)
            seq_adv = torch.stack(
                [adv_tokens[i][: max(1, len(comp_ids[i]))].mean() for i in range(n)]
            )
        elif a.objective == "ppo":
            adv_tokens, returns = self._ppo_advantages(
                prompt_ids, comp_ids, scores, valid, old_values
            )
            seq_adv = torch.stack(
                [adv_tokens[i][: max(1, len(comp_ids[i]))].mean() for i in range(n)]
            )
        else:
            method = GROUP_ADV_METHODS.get(a.objective, "drgrpo")
            seq_adv = group_advantages(scores, g, method, valid=valid, eps=a.adv_eps).reshape(-1)
        stats_out.update(
            adv_mean=float(seq_adv[valid_flat].mean()) if valid_flat.any() else 0.0,
            adv_std=float(seq_adv[valid_flat].std(unbiased=False)) if valid_flat.any() else 0.0,
            adv_min=float(seq_adv.min()),
            adv_max=float(seq_adv.max()),
        )

        mx_w = mx_active = old_seq = None
        if a.objective == "maxent_listwise":
            m = a.maxent
            width = max(1, max(len(c) for c in comp_ids))
            lengths_mask = _pad_rows([torch.ones(len(c)) for c in comp_ids], width)
            old_seq = sequence_logp(
                _pad_rows(old_logp, width), lengths_mask, m.length_normalize_policy
            )
            if a.beta > 0:
                ref_seq = sequence_logp(
                    _pad_rows(ref_logp, width), lengths_mask, m.length_normalize_ref
                )
                ref_seq = ref_seq.view(-1, g)
            else:
                ref_seq = torch.zeros_like(scores)
            _, mx_w = maxent_weights(scores, ref_seq, m.tau, a.beta, m.q_temperature, m.q_eps)
            mx_active = (
                active_groups(scores)
                if m.skip_zero_variance_groups
                else torch.ones(scores.shape[0], dtype=torch.bool)
            )
            mx_active = mx_active & valid.all(dim=1)

        # Pass 2: the update itself.
        self.model.train()
        opt, sched = self.ctx.optimizer, self.ctx.scheduler
        all_stats: list[dict] = []
        entropies: list[torch.Tensor] = []
        grad_norms: list[float] = []
        skipped = 0
        num_groups = n // g
        for epoch in range(a.epochs_per_batch):
            shuffle = (
                None if a.minibatches == 1 else self.cfg.train.seed * 7919 + self.step * 31 + epoch
            )
            for mb in group_minibatches(num_groups, g, a.minibatches, shuffle_seed=shuffle):
                mb_valid = [i for i in mb if valid_flat[i]]
                local = [
                    len(mb_valid),
                    sum(len(comp_ids[i]) for i in mb_valid),
                    int(mx_active[[i // g for i in mb[::g]]].sum()) if mx_active is not None else 0,
                ]
                # denominators count the whole minibatch across ranks
                seqs, toks, act = all_reduce_sum(local, self.dist)
                counts = MinibatchCounts(
                    sequences=int(seqs), tokens=int(toks), active_groups=int(act)
                )
                opt.zero_grad(set_to_none=True)
                first_stat = len(all_stats)  # this minibatch's micro-batch statistics start here
                for idx in self._micro_batches(mb, prompt_ids, comp_ids):
                    sb = build_sequence_batch(
                        [prompt_ids[i] for i in idx], [comp_ids[i] for i in idx], pad
                    )
                    with self._autocast():
                        out = self._forward(sb)
                    logp, ent = logprobs_and_entropy(
                        _scaled(out["logits"], temp), sb.completion_ids
                    )
                    if not need_pass1 and epoch == 0:
                        diffs += _engine_diffs(logp.detach(), idx, comp_ids, comps)
                    mask = sb.completion_mask * valid_flat[idx].float().unsqueeze(1)
                    T = mask.shape[1]
                    if need_old:
                        old = _pad_rows([old_logp[i] for i in idx], T)
                    else:
                        old = logp.detach()  # one update per batch: old policy == current policy
                    if adv_tokens is not None:
                        adv = _pad_rows([adv_tokens[i] for i in idx], T)
                    else:
                        adv = seq_adv[idx]
                    mbatch = MicroBatch(
                        logp=logp,
                        old_logp=old,
                        mask=mask,
                        advantages=adv,
                        entropy=ent,
                        ref_logp=_pad_rows([ref_logp[i] for i in idx], T) if need_ref else None,
                    )
                    if mx_w is not None:
                        gidx = sorted({i // g for i in idx})
                        mbatch.maxent_weights = mx_w[gidx]
                        mbatch.maxent_active = mx_active[gidx]
                        mbatch.old_seq_logp = (
                            old_seq[idx]
                            if need_old
                            else sequence_logp(
                                logp.detach(), sb.completion_mask, a.maxent.length_normalize_policy
                            )
                        )
                    if a.objective == "ppo":
                        mbatch.values = out["values"]
                        mbatch.old_values = _pad_rows([old_values[i] for i in idx], T)
                        mbatch.returns = _pad_rows([returns[i] for i in idx], T)
                    loss, st = micro_loss(cfg, mbatch, counts, self.kl_ctl.value)
                    if torch.isfinite(loss):
                        # FSDP/DDP average gradients over ranks; scaling by the world size makes
                        # that average the sum that global denominators expect.
                        (loss * self.dist.world_size).backward()
                    else:
                        st["nonfinite_loss"] = 1.0
                    all_stats.append(st)
                    entropies.append(ent.detach()[mask.bool()])
                params = [p for p in self.model.parameters() if p.requires_grad]
                params += list(self.ctx.extra_params())
                gn = torch.nn.utils.clip_grad_norm_(params, self.cfg.train.max_grad_norm)
                gn = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)
                if not math.isfinite(gn) or any(
                    s.get("nonfinite_loss") for s in all_stats[first_stat:]
                ):
                    opt.zero_grad(set_to_none=True)  # never apply a non-finite update
                    skipped += 1
                else:
                    opt.step()
                # free the gradients now rather than through the next rollout (~4 bytes/param)
                opt.zero_grad(set_to_none=True)
                grad_norms.append(gn)
        sched.step()
        if "kl" in (all_stats[0] if all_stats else {}):
            self.kl_ctl.update(float(np.mean([s["kl"] for s in all_stats if "kl" in s])), n_steps=1)
        if self.dist.enabled:  # pool every rank's micro-batch statistics and entropies
            gathered = all_gather_objects((all_stats, [e.tolist() for e in entropies]), self.dist)
            all_stats = [st for stats, _ in gathered for st in stats]
            entropies = [torch.tensor(e) for _, ents in gathered for e in ents]
        stats_out.update(summarize_update_stats(all_stats, entropies, grad_norms))
        stats_out.update(self._trust_stats(diffs))
        stats_out["nonfinite_skipped"] = float(skipped > 0)
        stats_out["_time_reference_total"] = t_ref
        stats_out["_time_reference"] = t_ref
        return stats_out

    def _micro_batches(self, indices, prompt_ids, comp_ids) -> list[list[int]]:
        """Forward/backward passes over ``indices``: whole groups in order for the listwise
        objective, otherwise sequences grouped by length (less padding: the update of 16 default-
        workload sequences took 5.5 s instead of 7.2 s, README "Performance")."""
        a = self.cfg.algo
        if a.objective == "maxent_listwise":
            return micro_batches(indices, a.micro_batch_size)
        return length_micro_batches(
            indices,
            [len(p) for p in prompt_ids],
            [len(c) for c in comp_ids],
            a.micro_batch_size,
            a.micro_batch_tokens,
        )

    def _forward(self, sb) -> dict:
        if self.cfg.algo.objective != "ppo":
            return {"logits": completion_logits(self.train_model, sb)}
        return self.ctx.value_forward(sb)

    def _reference_logp(self, sb, temp: float) -> torch.Tensor:
        with self._autocast():
            if self.ref_model is not None:
                logits = completion_logits(self.ref_model, sb)
            else:  # LoRA: the reference is the base model with adapters disabled
                with self.model.disable_adapter():
                    logits = completion_logits(self.model, sb)
        lp, _ = logprobs_and_entropy(_scaled(logits, temp), sb.completion_ids, entropy=False)
        return lp

    def _trust_stats(self, diffs: list[torch.Tensor]) -> dict[str, float]:
        """Engine vs trainer log-probs of the sampled tokens: mean/max |difference| and k3."""
        if self.dist.enabled:
            parts = all_gather_objects([d.tolist() for d in diffs], self.dist)
            diffs = [torch.tensor(x) for part in parts for x in part]
        if not diffs:
            return {}
        d = torch.cat(diffs)
        return {
            "logprob_diff_mean": float(d.abs().mean()),
            "logprob_diff_max": float(d.abs().max()),
            # k3 of engine vs trainer: E[exp(-d) + d - 1] with d = trainer - engine
            "logprob_k3": float((torch.exp(-d.clamp(-20, 20)) + d - 1).mean()),
        }

    def _global_rollout_metrics(self, scores, valid, comps, rewards) -> dict:
        """Rollout metrics over every rank's completions (each rank holds a slice of the batch)."""
        if self.dist.enabled:
            parts = all_gather_objects((scores, valid, comps, rewards), self.dist)
            scores = torch.cat([p[0] for p in parts])
            valid = torch.cat([p[1] for p in parts])
            comps = [c for p in parts for c in p[2]]
            rewards = BatchRewards(
                scores=[x for p in parts for x in p[3].scores],
                infos=[x for p in parts for x in p[3].infos],
                valid=[x for p in parts for x in p[3].valid],
                failures=[x for p in parts for x in p[3].failures],
            )
        return rollout_metrics(scores, valid, comps, rewards, self.cfg.rollout.max_new_tokens)

    def _psgrpo_step_advantages(self, prompt_texts, comps, comp_ids, scores, valid):
        """Per-token advantages of PS-GRPO variant 2 (PRM step scores + group-normalised outcome)."""
        from rlvr.algorithms import psgrpo_step_advantages

        step_scores, step_ids = self.step_scorer(
            self.tokenizer, prompt_texts, [c.text for c in comps], comp_ids
        )
        T = step_ids.shape[1]
        mask = torch.zeros(len(comp_ids), T)
        for i, c in enumerate(comp_ids):
            mask[i, : len(c)] = 1.0
        adv = psgrpo_step_advantages(
            step_scores,
            scores,
            step_ids,
            mask,
            self.cfg.algo.group_size,
            self.cfg.algo.adv_eps,
            valid=valid,
        )
        counts = [len(s) for s in step_scores]
        stats = {
            "step_count_mean": float(np.mean(counts)),
            "step_score_mean": float(np.mean([x for s in step_scores for x in s]))
            if any(counts)
            else 0.0,
        }
        return [adv[i, : len(c)] for i, c in enumerate(comp_ids)], stats

    def _ppo_advantages(self, prompt_ids, comp_ids, scores, valid, old_values):
        """GAE over tokens with the critic's values; the scalar reward sits on the last token."""
        a = self.cfg.algo
        n = len(comp_ids)
        pad = self.tokenizer.pad_token_id
        with torch.no_grad():
            for idx in self._micro_batches(list(range(n)), prompt_ids, comp_ids):
                sb = build_sequence_batch(
                    [prompt_ids[i] for i in idx], [comp_ids[i] for i in idx], pad
                )
                with self._autocast():
                    vals = self.ctx.value_forward(sb)["values"].float()
                for row, i in enumerate(idx):
                    old_values[i] = vals[row, : len(comp_ids[i])]
        T = max(1, max(len(c) for c in comp_ids))
        mask = torch.zeros(n, T)
        rew = torch.zeros(n, T)
        flat = scores.reshape(-1)
        for i, c in enumerate(comp_ids):
            if c and valid.view(-1)[i]:
                mask[i, : len(c)] = 1
                rew[i, len(c) - 1] = flat[i]
        values = _pad_rows(old_values, T)
        adv, ret = gae_advantages(rew, values, mask, a.ppo.gamma, a.ppo.lam)
        return [adv[i, : len(c)] for i, c in enumerate(comp_ids)], [
            ret[i, : len(c)] for i, c in enumerate(comp_ids)
        ]

    # ------------------------------------------------------------------ the run
    def fit(self) -> dict:
        """Train for ``train.max_steps`` steps with evals around it; returns the summary."""
        from rlvr.training.run_loop import run_training

        return run_training(self)


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Logits of the sampling distribution (no copy of the [B, T, V] tensor at temperature 1)."""
    return logits if temperature == 1.0 else logits / temperature


def _engine_diffs(
    trainer_logp: torch.Tensor, idx: list[int], comp_ids, comps
) -> list[torch.Tensor]:
    """Per-sequence trainer-minus-engine log-prob differences of the sampled tokens."""
    out = []
    for row, i in enumerate(idx):
        length = len(comp_ids[i])
        if length:
            out.append(
                trainer_logp[row, :length].float() - torch.tensor(comps[i].logprobs[:length])
            )
    return out


def _pad_rows(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        if r is not None and len(r):
            out[i, : len(r)] = r[:width].float()
    return out
