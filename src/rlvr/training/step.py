"""One training step as named, timed phases over one `RolloutBatch`:

    generate -> score -> logprobs -> prepare -> update -> sync

``Step`` holds no counters: it reads the step number and policy version from the `TrainState`
the run loop owns, and never branches on the objective (the objective's methods do the work).
"""

from __future__ import annotations

import contextlib
import functools
import random
import time
from collections.abc import Callable

import numpy as np
import torch

from rlvr.algorithms import kl_estimate, overlong_penalty
from rlvr.data.multimodal import render_inputs
from rlvr.distributed import all_gather_objects, all_reduce_sum
from rlvr.objectives.batch import RolloutBatch
from rlvr.rewards.runner import BatchRewards
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.episodes import check_env_failures, episode_scores
from rlvr.training.dynamic_sampling import assemble, count_informative
from rlvr.training.episode_groups import (
    episode_sums,
    episode_view,
    lay_out,
    mask_fillers,
    prepare_by_episode,
)
from rlvr.training.overlap import Lookahead, staleness_stats, stamp_version, sync_engine
from rlvr.training.preempt import StopSignals
from rlvr.training.rollout_correction import correction_weights
from rlvr.training.setup import Run
from rlvr.training.state import TrainState
from rlvr.training.step_metrics import advantage_stats, rollout_metrics
from rlvr.training.update import engine_diffs, update


class Step:
    """The phases of one step over the run's parts and the train state; calling it runs them
    once and returns (metrics, batch)."""

    def __init__(
        self,
        run: Run,
        state: TrainState,
        on_phase: Callable[[str], None] | None = None,
        stops: StopSignals | None = None,
    ) -> None:
        """``on_phase(name)`` is called after each timed phase (the memory meter's hook);
        ``stops``: the run's stop signals (training/preempt), which let an update finish and
        skip the weight push once a signal came."""
        self.run, self.state, self.cfg = run, state, run.cfg
        self.on_phase = on_phase
        self.stops = stops
        k = run.cfg.rollout.max_staleness
        remote = getattr(run.engine, "remote", False)
        # rollout.partial: a push pauses the worker's generation instead of waiting for it
        pause = run.engine.paused if remote and run.cfg.rollout.partial else None
        abort = getattr(run.engine, "abort_generations", None)  # a stop does not wait for them
        self._ahead = Lookahead(k, remote, pause, abort) if k > 0 else None

    # ------------------------------------------------------------------ the lookahead's life
    def state_dict(self, *, stopping: bool = False) -> dict:
        """What a checkpoint keeps of the step: the batches generated ahead
        (``rollout.max_staleness``). ``stopping`` (a stop signal's checkpoint): only the finished
        ones, and the prompt sampler goes back to before the first one dropped (the run ends
        after this checkpoint), so the resumed run generates those again from the same prompts
        and seeds."""
        if self._ahead is None:
            return {}
        state, sampler = self._ahead.state_dict(finished_only=stopping)
        if sampler is not None:
            self.state.sampler.load_state_dict(sampler)
        return {"lookahead": state}

    def load_state_dict(self, state: dict) -> None:
        if self._ahead is not None:
            self._ahead.load_state_dict(state.get("lookahead", {}))

    def close(self) -> None:
        """Stop a generation running ahead (its thread; aborted on a server), if any."""
        if self._ahead is not None:
            self._ahead.close()

    def __call__(self) -> tuple[dict, RolloutBatch]:
        """Run the step's phases once; returns (metrics, batch)."""
        times: dict[str, float] = {}
        t_step = time.perf_counter()

        cuda = self.run.device.type == "cuda"

        def timed(name: str, fn, *args):
            t = time.perf_counter()
            out = fn(*args)
            if cuda:  # kernels still queued (the optimizer step's) belong to this phase
                torch.cuda.synchronize(self.run.device)
            times[name] = times.get(name, 0.0) + time.perf_counter() - t
            if self.on_phase is not None:
                self.on_phase(name)
            return out

        kl_coef = self.state.kl_ctl.value  # the coefficient this step's loss uses
        batch = timed("time_rollout", self.next_batch)
        metrics = timed("time_reward", self.score, batch)
        if self.cfg.algo.dynamic_sampling:
            batch, metrics = self.fill(batch, timed)
        if self._ahead is not None:  # rollout.max_staleness=k: request up to step + k
            self._ahead.log(metrics, times)
            for ahead in self._ahead.to_request(self.state.step, self.cfg.train.max_steps):
                timed("time_rollout", self._request_ahead, ahead)
        metrics.update(staleness_stats(batch.completions, self.state.policy_version))
        if self.cfg.rollout.sleep_during_update and hasattr(self.run.engine, "sleep"):
            self.run.engine.sleep()  # GPU: free the engine's memory for the update (wakes on sync)
        lr = self.state.scheduler.get_last_lr()[0]
        diffs = timed("time_logprobs", self.logprobs, batch, times)
        metrics.update(timed("time_prepare", self.prepare, batch))
        guard = self.stops.updating if self.stops is not None else contextlib.nullcontext
        with guard():
            update_metrics, more_diffs = timed(
                "time_update", update, batch, self.state, self.run, self.stops
            )
        metrics.update(update_metrics)
        metrics.update(self._trust_stats(diffs + more_diffs))
        if self._ahead is not None:
            self._ahead.waited()  # from here: the wait of this push only
        # once a stop signal came (one process: the ranks push together), no push: a resume
        # pushes the restored weights, and the push may wait for a generation running ahead
        stopping = self.stops is not None and self.stops.stopping and not self.run.dist.enabled
        sync = None if stopping else timed("time_sync", self.sync)
        times.setdefault("time_sync", 0.0)
        if self._ahead is not None:  # the push waited for a generation in flight (overlap._Gate)
            times["time_wait_ahead"] = self._ahead.waited()
            times["time_sync"] -= times["time_wait_ahead"]
        if sync:
            metrics.update({f"sync_{k}": float(v) for k, v in sync.items()})
        times.setdefault("time_reference", 0.0)  # 0 without a reference model
        times["time_logprobs"] -= times["time_reference"]
        metrics.update(times)
        metrics["time_step"] = time.perf_counter() - t_step
        gen_tokens = sum(c.model_token_count for c in batch.completions) * self.run.dist.world_size
        # with dynamic sampling every round's replies were generated, not only the kept ones
        generated = metrics.pop("ds_gen_tokens", gen_tokens)
        metrics["gen_tokens_per_s"] = generated / max(times["time_rollout"], 1e-9)
        metrics["train_tokens_per_s"] = (
            gen_tokens * self.cfg.algo.epochs_per_batch / max(times["time_update"], 1e-9)
        )
        metrics["lr"] = lr
        metrics["epoch"] = self.state.sampler.epoch
        metrics["policy_version"] = float(self.state.policy_version)
        if self.cfg.algo.beta > 0:
            metrics["kl_coef"] = kl_coef
        return metrics, batch

    def seed(self, round_: int = 0, step: int | None = None) -> int:
        """Seed every RNG from (train.seed, step, dynamic-sampling round): a resumed step draws
        what it drew before. ``step`` defaults to the running step (0-based ``state.step``)."""
        step = self.state.step if step is None else step
        seed = step_seed(self.cfg.train.seed, step, round_)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        return seed

    def generate(self, round_: int = 0) -> RolloutBatch:
        return self.request(self.state.step, round_)()

    def _request_ahead(self, step: int) -> None:
        """Queue step ``step``'s batch in the lookahead, with the sampler's state before its
        prompts are drawn."""
        sampler = dict(self.state.sampler.state_dict())
        self._ahead.start(step, self.request(step), sampler)

    def request(self, step: int, round_: int = 0) -> Callable[[], RolloutBatch]:
        """Draw step ``step``'s prompts and seeds and sync the engine, in this thread; the
        returned function generates (and touches no RNG or counter of this process, so
        `rlvr.training.overlap.Lookahead` may run it in a thread)."""
        cfg = self.cfg
        seed = self.seed(round_, step)
        # Every rank draws the same global prompts and keeps its own slice of whole prompts.
        global_idx = self.state.sampler.next_indices()
        per = len(global_idx) // self.run.dist.world_size
        lo = self.run.dist.rank * per
        rows = [self.run.train_rows[i] for i in global_idx[lo : lo + per]]
        d = cfg.data  # every row's prompt length was checked before the first step
        episodes = self.run.episodes  # env.name: prompts come from the environments' reset()
        texts, ids, vision = (
            render_inputs(rows, d.template, self.run.tokenizer, d.system_prompt, self.run.processor)
            if episodes is None
            else ([], [], None)
        )
        self.sync()
        params = self._params(seed, lo, len(rows))
        return functools.partial(self.sample, rows, texts, ids, vision, params)

    def _params(self, seed: int, lo: int, n_rows: int) -> SamplingParams:
        """The sampling of a batch seeded ``seed`` whose rows start at global prompt ``lo``."""
        r = self.cfg.rollout
        return SamplingParams(
            n=self.cfg.algo.group_size,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            max_new_tokens=r.max_new_tokens,
            stop=tuple(r.stop),
            seed=seed + 7919 * self.run.dist.rank,
            prompt_seeds=tuple(seed * 4099 + lo + j for j in range(n_rows))
            if r.seed_per_prompt
            else None,
        )

    def sample(
        self,
        rows: list[dict],
        texts: list[str],
        ids: list[list[int]],
        vision: list | None,
        params: SamplingParams,
    ) -> RolloutBatch:
        """Generate a batch with the engine (touches no RNG or counter of this process)."""
        engine, g, episodes = self.run.engine, self.cfg.algo.group_size, self.run.episodes
        version = engine.policy_version  # the weights it holds as the generation starts
        if episodes is not None:
            ep_texts, ep_ids, groups = episodes.run(engine, rows, params)
            groups, episode_of = lay_out(groups, self.run.dist)  # an agent's split episodes
            stamp_version(groups, version)
            width = len(groups[0]) if groups else g
            return RolloutBatch(rows, ep_texts, ep_ids, groups, width, episode_of=episode_of)
        images = {} if vision is None else {"vision": vision}  # text engines take no images
        groups = engine.generate(ids, params, **images)
        stamp_version(groups, version)
        return RolloutBatch(rows, texts, ids, groups, g, vision=vision)

    def resample(self, batch: RolloutBatch, step: int) -> RolloutBatch:
        """Step ``step``'s batch generated again from its prompts and seeds on the current
        weights (pushed first): a batch ahead dropped as too stale (`overlap.Lookahead.take`)."""
        self.push()
        seed = step_seed(self.cfg.train.seed, step)  # seed(0, step), no RNG touched
        lo = self.run.dist.rank * len(batch.rows)
        params = self._params(seed, lo, len(batch.rows))
        return self.sample(batch.rows, batch.prompt_texts, batch.prompt_ids, batch.vision, params)

    def score(self, batch: RolloutBatch) -> dict:
        comps, g = batch.completions, batch.group_size
        flat_rows = [r for r in batch.rows for _ in range(g)]
        rewards = self.run.rewards.score_batch(
            batch.seq_prompt_texts,
            [c.response for c in comps],  # an episode's last model turn
            [r["answer"] for r in flat_rows],
            flat_rows,
            [c.truncated for c in comps],
            where=f"step {self.state.step + 1}",
        )
        flat_scores, flat_valid = episode_scores(comps, rewards.scores, rewards.valid)
        scores = torch.tensor(flat_scores, dtype=torch.float32).view(-1, g)
        valid = torch.tensor(flat_valid, dtype=torch.bool).view(-1, g)
        batch.rewards = rewards
        batch.valid = valid
        batch.scores = torch.where(valid, torch.nan_to_num(scores), torch.zeros_like(scores))
        mask_fillers(batch)
        shaping = self._overlong(batch)
        metrics = self._global_rollout_metrics(batch)
        check_env_failures(metrics, comps, self.cfg.env.max_failure_fraction)
        return {**metrics, **shaping}

    def _overlong(self, batch: RolloutBatch) -> dict[str, float]:
        """DAPO's soft overlong punishment (arXiv 2503.14476) added to the valid sequences'
        scores, whatever the objective (``reward.overlong_buffer`` > 0); the reward metrics then
        include it. Returns this rank's mean penalty over valid sequences."""
        if self.cfg.reward.overlong_buffer <= 0:
            return {}
        pen = self._overlong_penalties(batch)
        batch.scores = batch.scores + pen
        return {"overlong_penalty_mean": float(pen.sum()) / max(1, int(batch.valid.sum()))}

    def _overlong_penalties(self, batch: RolloutBatch) -> torch.Tensor:
        rc = self.cfg.reward
        lengths = torch.tensor([len(c) for c in batch.comp_ids]).view_as(batch.scores)
        pen = overlong_penalty(
            lengths, self.cfg.rollout.max_new_tokens, rc.overlong_buffer, rc.overlong_factor
        )
        return torch.where(batch.valid, pen, torch.zeros_like(pen))

    def fill(self, first: RolloutBatch, timed) -> tuple[RolloutBatch, dict]:
        """DAPO dynamic sampling (`rlvr.training.dynamic_sampling`): more rounds of fresh prompts
        until this rank holds as many informative groups (``algo.dynamic_sampling_metric``) as it
        draws per round, at most
        ``algo.dynamic_sampling_max_rounds`` rounds; every rank draws while any one is short
        (generation and scoring are collective)."""
        need, rounds = len(first.prompt_ids), [first]
        metric = self.cfg.algo.dynamic_sampling_metric
        while len(rounds) < self.cfg.algo.dynamic_sampling_max_rounds:
            have = count_informative(rounds, metric)
            if not all_reduce_sum([float(have < need)], self.run.dist)[0]:
                break
            if self._ahead is not None:  # these prompts are drawn after the batches ahead
                self._ahead.pin()
            batch = timed("time_rollout", self.generate, len(rounds))
            timed("time_reward", self.score, batch)
            rounds.append(batch)
        batch, kept = assemble(rounds, need, metric)
        metrics = self._global_rollout_metrics(batch)
        if self.cfg.reward.overlong_buffer > 0:  # the kept sequences' penalty (already applied)
            pen = self._overlong_penalties(batch)
            metrics["overlong_penalty_mean"] = float(pen.sum()) / max(1, int(batch.valid.sum()))
        drawn, kept = all_reduce_sum([float(need * len(rounds)), float(kept)], self.run.dist)
        metrics.update(ds_prompts_drawn=drawn, ds_prompts_kept=kept, ds_rounds=float(len(rounds)))
        tokens = sum(len(c) for b in rounds for c in b.comp_ids)
        metrics["ds_gen_tokens"] = float(
            tokens * self.run.dist.world_size
        )  # run() turns it into a rate
        return batch, metrics

    def logprobs(self, batch: RolloutBatch, times: dict) -> list[torch.Tensor]:
        """No-grad passes the objective needs: old log-probs (and the engine trust check from
        them), reference log-probs, critic values. With one update per batch and no reference
        the update's own forward gives the trainer log-probs: no extra pass."""
        needs = self.run.objective.needs()
        if not (needs.old_logp or needs.reference or needs.values):
            return []
        n = batch.size
        comp_ids = batch.comp_ids
        temperature = self.run.temperature
        old: list = [None] * n
        ref: list = [None] * n
        values: list = [None] * n
        diffs: list[torch.Tensor] = []
        pad = self.run.tokenizer.pad_token_id
        comps = batch.completions
        engine: list = [None] * n  # the engine's log-probs, for the rollout correction
        # the policy itself, dropout off (model.lora.dropout, a model's own): the engine samples
        # without dropout, and the update (which sets train mode again) left it on
        self.state.model.eval()
        with torch.no_grad():
            for idx in self.run.objective.micro_batches(list(range(n)), batch):
                sb = batch.sequence_batch(
                    idx,
                    pad,
                    self.run.image_token_id,
                    share_prompt=self.cfg.algo.share_prompt,
                    device=self.run.device,
                )
                with self.run.autocast_context():
                    out = self.run.objective.forward(self.state.model, sb)
                lp, _ = out.pop("policy").logprobs(sb, temperature, entropy=False)
                diffs += engine_diffs(lp, idx, comp_ids, batch.completions)
                t = time.perf_counter()
                ref_lp = self.run.reference_logprobs(sb, temperature) if needs.reference else None
                times["time_reference"] = times.get("time_reference", 0.0) + (
                    time.perf_counter() - t
                )
                # the batch keeps what the passes computed on the CPU, with the rewards and the
                # engine's log-probs; a micro-batch moves to the model's device (MicroBatch)
                lp = lp.cpu()
                ref_lp = None if ref_lp is None else ref_lp.cpu()
                vals = out["values"].float().cpu() if "values" in out else None
                for row, i in enumerate(idx):
                    length = len(comp_ids[i])
                    old[i] = lp[row, :length]
                    engine[i] = torch.tensor(comps[i].logprobs[:length], dtype=torch.float32)
                    if ref_lp is not None:
                        ref[i] = ref_lp[row, :length]
                    if vals is not None:
                        values[i] = vals[row, :length]
        batch.old_logp = old
        batch.ref_logp = ref if needs.reference else None
        batch.values = values if needs.values else None
        if self.cfg.algo.correction() is not None:
            batch.tok["engine_logp"] = engine
        return diffs

    def prepare(self, batch: RolloutBatch) -> dict:
        """KL as a reward penalty (``algo.kl_mode=reward``), then the objective's preparation,
        then statistics of the advantages the loss really uses."""
        a = self.cfg.algo
        if a.kl_mode == "reward" and batch.ref_logp is not None and self.state.kl_ctl.value > 0:
            # an agent's split episode pays the KL of all its sequences' model tokens
            pen = episode_sums(batch, kl_penalty(batch, a.kl_estimator))
            batch.scores = batch.scores - self.state.kl_ctl.value * pen
        rc = a.correction()
        tis = correction_weights(batch, rc) if rc is not None else {}
        stats = prepare_by_episode(batch, self.run.objective.prepare)
        return {**advantage_stats(batch), **tis, **stats}

    def next_batch(self) -> RolloutBatch:
        """This step's batch: the one generated ahead (waiting for it), else generated now. A
        batch ahead more than ``rollout.max_staleness`` versions behind is generated again."""
        ahead, step = self._ahead, self.state.step
        batch = ahead.take(step) if ahead is not None else None
        if batch is None:
            return self.generate()
        if ahead.too_stale(batch, self.state.policy_version):
            t = time.perf_counter()
            fresh = self.resample(batch, step)
            ahead.replaced(fresh, time.perf_counter() - t)
            return fresh
        return batch

    def sync(self, every: int | None = None) -> dict | None:
        """Push the weights to the engine if it is ``every`` (``rollout.sync_every``) or more
        versions behind, never under a generation running ahead (`overlap.Lookahead.guard`)."""
        every = self.cfg.rollout.sync_every if every is None else every
        guard = self._ahead.guard if self._ahead is not None else contextlib.nullcontext
        return sync_engine(
            self.run.engine, self.state, self.run.named_weights, every=every, guard=guard
        )

    def push(self) -> dict | None:
        """Give the engine the current weights (evaluation, a stale batch's regeneration)."""
        return self.sync(every=1)

    def _global_rollout_metrics(self, batch: RolloutBatch) -> dict:
        """Rollout metrics over every rank's completions (each rank holds a slice)."""
        scores, valid, comps, rewards = episode_view(batch, batch.rewards)
        if self.run.dist.enabled:
            parts = all_gather_objects((scores, valid, comps, rewards), self.run.dist)
            scores = torch.cat([p[0] for p in parts])
            valid = torch.cat([p[1] for p in parts])
            comps = [c for p in parts for c in p[2]]
            rewards = BatchRewards(
                scores=[x for p in parts for x in p[3].scores],
                infos=[x for p in parts for x in p[3].infos],
                valid=[x for p in parts for x in p[3].valid],
                failures=[x for p in parts for x in p[3].failures],
                errors=[x for p in parts for x in p[3].errors],
            )
        return rollout_metrics(scores, valid, comps, rewards, self.cfg.rollout.max_new_tokens)

    def _trust_stats(self, diffs: list[torch.Tensor]) -> dict[str, float]:
        """Engine vs trainer log-probs of the sampled tokens: mean/max |difference| and k3."""
        if self.run.dist.enabled:
            parts = all_gather_objects([d.tolist() for d in diffs], self.run.dist)
            diffs = [torch.tensor(x) for part in parts for x in part]
        if not diffs:
            return {}
        d = torch.cat(diffs)
        return {
            "logprob_diff_mean": float(d.abs().mean()),
            "logprob_diff_max": float(d.abs().max()),
            # k3 of the engine against the trainer, E[exp(-d) + d - 1] with d = trainer - engine
            "logprob_k3": float(kl_estimate(d, torch.zeros_like(d), "k3").mean()),
        }


def step_seed(train_seed: int, step: int, round_: int = 0) -> int:
    """The seed of step ``step``'s generation round ``round_`` (dynamic sampling's rounds)."""
    return train_seed * 1_000_003 + step + 104_729 * round_


def kl_penalty(batch: RolloutBatch, kind: str) -> torch.Tensor:
    """``[P, G]``: each sequence's summed per-token KL estimate ``kind`` of the sampling policy
    against the reference (the penalty ``algo.kl_mode=reward`` subtracts, times the coefficient)."""
    out = torch.zeros(batch.size)
    # an episode's environment tokens carry no KL; single-turn replies are the model's alone
    episodes = any(c.loss_mask is not None for c in batch.completions)
    masks = batch.loss_masks if episodes else None
    for i, (lp, ref) in enumerate(zip(batch.old_logp, batch.ref_logp, strict=True)):
        if len(lp):
            kl = kl_estimate(lp.float(), ref.float(), kind)
            out[i] = (kl * masks[i] if masks is not None else kl).sum()
    return out.view(-1, batch.group_size)
