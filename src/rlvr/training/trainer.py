"""`Trainer`: one RL fine-tuning run, built from a config.

    trainer = Trainer(load_config("run.yaml"))   # or Trainer(cfg, model=m, tokenizer=t)
    summary = trainer.fit()                      # steps, evals, checkpoints, final save

The pieces: `setup.setup_run` builds the run's parts once (the `Run` holder: data, model, engine,
rewards, objective, run dir) and the `TrainState` (what a checkpoint saves); `Step` runs one
step's phases; `fit` below is the loop (step counter, evaluations, health gate, checkpoints), with
its status, resume and save pieces in `loop`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from rlvr import onednn_cache
from rlvr.allocator import describe as describe_allocator
from rlvr.config import Config
from rlvr.data.rows import reward_line
from rlvr.eval.in_training import InTrainingEvaluator
from rlvr.jsonio import atomic_write_text
from rlvr.model.precision import precision_text
from rlvr.objectives.batch import RolloutBatch
from rlvr.sandbox import in_use as sandbox_in_use
from rlvr.telemetry.health import HealthStop, first_stop, write_health
from rlvr.telemetry.keys import MEMORY_PLAN_KEY
from rlvr.telemetry.samples import write_samples
from rlvr.telemetry.sinks import MetricsLogger, read_metrics, truncate_metrics
from rlvr.telemetry.spikes import SpikeLog
from rlvr.training.loop import (
    checkpoint_last_step,
    data_line,
    fmt_eval,
    health_gate,
    interrupt_note,
    postfix,
    print_summary,
    resume,
    sample_records,
    save,
    save_final,
    save_on_stop,
    truncation_notes,
    write_status,
)
from rlvr.training.memory import GIB, MemoryMeter, compare
from rlvr.training.preempt import Preempted, StopSignals
from rlvr.training.preflight.checks import correction_off_hint
from rlvr.training.setup import Run, setup_run
from rlvr.training.step import Step


class Trainer:
    """One run. ``Trainer(cfg).fit()`` returns a summary dict; ``train_step()`` runs one step
    (``fit`` then moves ``state.step``). Pass ``model``/``tokenizer`` (and a VLM's
    ``processor``) to train an already-loaded model (notebooks, tests)."""

    def __init__(
        self,
        cfg: Config,
        *,
        model=None,
        tokenizer=None,
        processor=None,
        run_dir: Path | None = None,
    ):
        self.cfg = cfg
        self.run: Run
        self.run, self.state = setup_run(
            cfg, model=model, tokenizer=tokenizer, processor=processor, run_dir=run_dir
        )
        self.memory = MemoryMeter(self.run.device, self.run.dist, self.run.engine)
        # a step may be abandoned before its update only where no other rank waits on it and
        # no batch ahead was drawn (see training/preempt)
        dist = self.run.dist
        self.stops = StopSignals(
            cfg.train.stop_signals,
            cfg.train.stop_grace_s,
            abandon=not dist.enabled and cfg.rollout.max_staleness == 0,
            ranks=dist.enabled,
        )
        self.step_fn = Step(self.run, self.state, on_phase=self.memory.phase, stops=self.stops)
        self.last_batch: RolloutBatch | None = None
        self.history: list[dict] = []  # every step's metrics, in order

    @property
    def model(self) -> torch.nn.Module:
        return self.run.model

    @property
    def tokenizer(self):
        return self.run.tokenizer

    @property
    def engine(self):
        return self.run.engine

    @property
    def step(self) -> int:
        """Steps completed (``fit`` moves it)."""
        return self.state.step

    def train_step(self) -> dict:
        """Generate, score, update and sync once; returns the step's metrics (with the
        trainable and total parameter counts and the memory figures)."""
        self.memory.begin_step()
        metrics, self.last_batch = self.step_fn()
        return {**metrics, **self.run.param_counts, **self.memory.end_step()}

    def fit(self) -> dict:
        """Train for ``train.max_steps`` steps with evaluations around them; returns the summary.

        Resumes from ``run.resume_from`` when the run names a checkpoint; writes ``status.json``
        (running, then finished, interrupted, preempted, stopped_by_health or failed)."""
        run, state, cfg = self.run, self.state, self.cfg
        run_dir, main = run.run_dir, run.dist.is_main
        stops = self.stops
        try:
            extra, self.history = resume(run, state, self.step_fn)
        except BaseException:
            run.close()
            raise
        # a stop signal skipped the evaluation of the step the run resumes at: it runs first, and
        # its scores join that step's metrics line (logged again below)
        pending = (extra.get("evaluator") or {}).get("pending")
        pending_line = None
        if pending is not None and self.history and self.history[-1]["step"] == pending:
            pending_line = self.history.pop()
            truncate_metrics(run_dir, pending - 1)
        logger = MetricsLogger(
            run_dir,
            tensorboard=cfg.logging.tensorboard,
            wandb=cfg.logging.wandb,
            wandb_project=cfg.logging.wandb_project,
            run_name=run_dir.name,
        )
        gate = health_gate(run)
        for m in self.history:  # a resumed run: bring the gate's streak counters back
            gate.check(m["step"], m)
        if gate.events:
            write_health(run_dir, gate.events, None)
        spikes = SpikeLog(run_dir, threshold=cfg.logging.spike_threshold)
        write_status(run_dir, "running")
        summary = self._banner()
        plan = run.memory_plan
        if plan is not None:
            summary["memory_plan"] = plan.to_dict()
        # a fresh run's first metrics line carries the plan's peak (the report draws it)
        first_line = (
            {MEMORY_PLAN_KEY: plan.peak / GIB} if plan is not None and not state.step else {}
        )
        t_run = time.perf_counter()
        evaluator = None
        stops.install()
        try:
            evaluator = InTrainingEvaluator(
                cfg,
                run_dir=run_dir,
                engine=run.engine,
                tokenizer=run.tokenizer,
                processor=run.processor,
                rewards=run.rewards,
                model=run.model,
                heldout_rows=run.eval_rows,
                train_rows=run.train_rows,
                sync=self.step_fn.push,  # never under a generation running ahead
            )
            if "evaluator" in extra:
                evaluator.load_state_dict(extra["evaluator"])
            if state.step == 0:
                before = evaluator.before(state.step)
            else:  # resumed: the eval before training is already in metrics.jsonl
                first = read_metrics(run_dir)[:1]
                before = {}
                if first and first[0]["step"] == 0:
                    summary["before"] = {k: v for k, v in first[0].items() if k.startswith("eval/")}
            if before:
                logger.log({"step": 0, **before, **first_line})
                first_line = {}
                summary["before"] = {k: v for k, v in before.items() if k.startswith("eval/")}
                if main:
                    print(f"[rlvr] before training: {fmt_eval(summary['before'])}", flush=True)
                    for line in truncation_notes(cfg, before):
                        print(f"[rlvr] warning: {line}", file=sys.stderr, flush=True)
            if pending_line is not None:
                last = state.step == cfg.train.max_steps
                scores = evaluator.at_step(state.step, last)
                if last and scores and "before" in summary:
                    summary["after"] = {k: v for k, v in scores.items() if k.startswith("eval/")}
                pending_line.update(scores)
                logger.log(pending_line)
                self.history.append(pending_line)
                events = gate.check(state.step, pending_line)
                if events:
                    write_health(run_dir, gate.events, None)
                if evaluator.stop_reason:
                    summary["early_stop"] = self._early_stop(state.step, evaluator.stop_reason)
            bar = tqdm(
                range(state.step, cfg.train.max_steps if "early_stop" not in summary else 0),
                initial=state.step,  # a resumed run counts on from its checkpoint's step
                total=cfg.train.max_steps,
                desc="train",
                unit="step",
                disable=not (cfg.logging.progress and main),
                dynamic_ncols=True,
            )
            for _ in bar:
                stops.begin_step(state)
                metrics = self.train_step()
                state.step += 1  # the one place the step counter moves
                step = state.step
                metrics = {"step": step, **metrics, **first_line}
                first_line = {}
                last = step == cfg.train.max_steps
                # once a stop signal came (every rank agrees here), only what the checkpoint
                # needs: no evaluation (one under way is cut short), no samples
                stopping = stops.requested(run.dist) is not None
                scores = stops.cut_short(evaluator.at_step, step, last)
                if scores is None:
                    stopping = True
                    evaluator.skip(step, last)
                    scores = {}
                metrics.update(scores)
                if last and scores and "before" in summary:
                    summary["after"] = {k: v for k, v in scores.items() if k.startswith("eval/")}
                batch = self.last_batch
                spikes.maybe_record(
                    step, metrics.get("grad_norm_max", 0.0), metrics, batch.prompt_texts
                )
                sample_every = cfg.logging.samples_every
                # the first and last steps too: a short run still shows what the model wrote
                samples = sample_every and (step % sample_every == 0 or step == 1 or last)
                if samples and not stopping:
                    write_samples(run_dir, step, sample_records(batch))
                logger.log(metrics)
                self.history.append(metrics)
                bar.set_postfix(postfix(metrics), refresh=False)
                events = gate.check(step, metrics)
                for ev in events if main else []:
                    tqdm.write(
                        f"[rlvr] health {ev.action}: {ev.rule} at step {ev.step}: "
                        f"{ev.values}\n  {ev.advice}",
                        file=sys.stderr,
                    )
                stop = first_stop(events)
                if events:
                    write_health(run_dir, gate.events, stop)
                if stop is not None:
                    raise HealthStop(stop)
                every = cfg.train.save_every
                if every and (step % every == 0 or last or evaluator.stop_reason):
                    save(run, state, self.step_fn, evaluator, stopping=stopping)
                if evaluator.stop_reason:
                    summary["early_stop"] = self._early_stop(step, evaluator.stop_reason)
                    break
                # every rank, at the same step (a signal may have come since the first agreement)
                signum = stops.signum if stopping else stops.requested(run.dist)
                if signum is not None:
                    raise Preempted(signum)
            summary["final_model"] = str(save_final(run))
            summary["wall_time_s"] = time.perf_counter() - t_run
            summary["steps"] = state.step
            summary["memory"] = compare(plan, self.memory.finish())  # every rank takes part
            atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=1))
            write_status(run_dir, "finished")
            if main:
                print_summary(summary)
            return summary
        except HealthStop as stop:
            # the gate judged the run, not its weights: the work up to the stop is kept (a run
            # that solved its task stops on reward_stuck_high), as a checkpoint, not as `final`
            note = checkpoint_last_step(run, state, self.step_fn, evaluator)
            write_status(run_dir, "stopped_by_health", rule=stop.event.rule, checkpoint=note)
            stop.checkpoint = note
            raise
        except Preempted as stop:
            try:
                note = save_on_stop(run, state, self.step_fn, evaluator, stop, stops)
            except BaseException as exc:  # status.json must not keep saying "running"
                write_status(
                    run_dir,
                    "failed",
                    error=f"the checkpoint on {stop.signal_name} failed: {type(exc).__name__}: {exc}",
                    signal=stop.signal_name,
                    step=state.step,
                )
                raise
            write_status(
                run_dir, "preempted", signal=stop.signal_name, step=state.step, checkpoint=note
            )
            if main:
                print(
                    f"\n[rlvr] preempted by {stop.signal_name} after step {state.step}: {note}; "
                    "continue with the same command and `--resume auto`",
                    file=sys.stderr,
                    flush=True,
                )
            raise
        except KeyboardInterrupt:
            note = interrupt_note(run_dir)
            write_status(run_dir, "interrupted", step=state.step, checkpoint=note)
            if main:
                print(
                    f"\n[rlvr] interrupted after step {state.step}: {note}",
                    file=sys.stderr,
                    flush=True,
                )
            raise
        except BaseException as exc:
            write_status(run_dir, "failed", error=f"{type(exc).__name__}: {exc}", step=state.step)
            raise
        finally:
            stops.restore()
            logger.close()
            self.step_fn.close()
            run.close()

    def _early_stop(self, step: int, reason: str) -> str:
        """Record an early stop at ``step`` (``early_stop.json``); returns the reason."""
        atomic_write_text(
            self.run.run_dir / "early_stop.json", json.dumps({"step": step, "reason": reason})
        )
        tqdm.write(f"[rlvr] early stop at step {step}: {reason}")
        return reason

    def _banner(self) -> dict:
        """Print the run's first lines (directory, engine, precision, allocator); returns the
        summary's first entries."""
        run, cfg = self.run, self.cfg
        precision = precision_text(cfg, run.autocast, run.device)
        malloc = describe_allocator(cfg.train.allocator)
        onednn = onednn_cache.in_effect()
        if run.dist.is_main:
            ranks = f", processes: {run.dist.world_size}" if run.dist.enabled else ""
            print(
                f"[rlvr] run directory: {run.run_dir}  (engine: {run.engine.name}, "
                f"objective: {cfg.algo.objective}{ranks})",
                flush=True,
            )
            print(f"[rlvr] precision: {precision}", flush=True)
            print(f"[rlvr] malloc: {malloc}; oneDNN primitive cache: {onednn}", flush=True)
            if (box := sandbox_in_use()) is not None:  # model-written code runs (docs/sandbox.md)
                print(f"[rlvr] sandbox: {box}", flush=True)
            print(f"[rlvr] data: {data_line(cfg, run.train_rows, run.eval_rows)}", flush=True)
            print(f"[rlvr] reward: {reward_line(cfg)}", flush=True)
            for note in cfg.inferred().values():
                print(f"[rlvr] inferred: {note}", flush=True)
            if (rc := cfg.algo.correction()) is not None:
                bounds = f"ratios kept in [{rc.bounds()[0]:g}, {rc.cap:g}]"
                how = {
                    "truncate": f"weights capped at {rc.cap:g}",
                    "mask": f"{bounds}, weighted by their ratio",
                    "reject": f"{bounds}, weighted 1",
                }[rc.action]
                print(
                    f"[rlvr] rollout correction: {rc.level} {rc.action}, {how} "
                    f"({correction_off_hint(cfg)}; docs/rollout.md)",
                    flush=True,
                )
        return {
            "run_dir": str(run.run_dir),
            "engine": run.engine.name,
            "objective": cfg.algo.objective,
            "precision": precision,
            "allocator": malloc,
            "onednn_primitive_cache": onednn,
        }
