"""The outer loop of a run: evals before and after, steps with telemetry and health, checkpoints
(every ``train.save_every`` steps and at the end), resume from a checkpoint, final save."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

from rlvr import onednn_cache
from rlvr.allocator import describe as describe_allocator
from rlvr.checkpoint.full import latest_checkpoint, restore_checkpoint, save_checkpoint
from rlvr.checkpoint.sharded import restore_sharded_checkpoint, save_sharded_checkpoint
from rlvr.distributed import barrier, full_state_dict
from rlvr.eval.in_training import InTrainingEvaluator
from rlvr.jsonio import atomic_write_text, dumps_line, read_jsonl
from rlvr.model.loading import save_model_folder
from rlvr.model.precision import precision_text
from rlvr.objectives.batch import RolloutBatch
from rlvr.telemetry.health import (
    HEALTH_EVENTS_FILE,
    HEALTH_FILE,
    HealthGate,
    HealthStop,
    first_stop,
    write_health,
)
from rlvr.telemetry.samples import list_sample_steps, samples_path, write_samples
from rlvr.telemetry.sinks import MetricsLogger, read_metrics, truncate_metrics
from rlvr.telemetry.spikes import SPIKES_FILE, SpikeLog
from rlvr.training.step import sync_engine


def write_status(run_dir: Path, state: str, **extra) -> None:
    """``status.json`` says whether a run finished; a crashed run never looks finished."""
    payload = {"state": state, "time": time.time(), **extra}
    atomic_write_text(run_dir / "status.json", json.dumps(payload, indent=1))


def save_final(trainer) -> Path:
    """HF-format model (or LoRA adapter) + tokenizer under ``run_dir/final``, written atomically.

    With several processes every rank takes part in gathering the full weights; rank 0 writes.
    """
    final = trainer.ctx.run_dir / "final"
    info = trainer.dist
    state = full_state_dict(trainer.model, info) if info.enabled else None
    if state is not None and getattr(trainer.model.config, "tie_word_embeddings", False):
        # gathered tensors no longer share storage; drop the tied copies save_pretrained would keep
        for key in getattr(trainer.model, "all_tied_weights_keys", None) or {}:
            state.pop(key, None)
    if info.enabled and not info.is_main:
        return final
    return save_model_folder(  # a VLM's processor saves its tokenizer with it
        trainer.model, trainer.ctx.processing, final, state_dict=state, replace=True
    )


def _postfix(m: dict) -> dict:
    out = {"reward": f"{m.get('reward_mean', 0):.2f}", "s/step": f"{m.get('time_step', 0):.1f}"}
    if "correct" in m:
        out["correct"] = f"{m['correct']:.2f}"
    if "kl" in m:
        out["kl"] = f"{m['kl']:.3g}"
    out["len"] = f"{m.get('response_len_mean', 0):.0f}"
    return out


def rewind_run_files(run_dir: Path, step: int) -> None:
    """Forget what a run wrote after ``step`` (metrics, spikes, health events, samples, evals),
    so the steps re-run after a resume are recorded once. ``step=-1`` forgets everything."""
    truncate_metrics(run_dir, step)
    for name in (SPIKES_FILE, HEALTH_EVENTS_FILE):
        path = run_dir / name
        if path.exists():
            kept = [r for r in read_jsonl(path) if int(r.get("step", 0)) <= step]
            atomic_write_text(path, "".join(dumps_line(r) for r in kept))
    for s in list_sample_steps(run_dir):
        if s > step:
            samples_path(run_dir, s).unlink()
    for path in (run_dir / "eval").glob("step_*.json"):
        if int(path.stem.split("_")[1]) > step:
            path.unlink()
    for name in ("early_stop.json", "summary.json", HEALTH_FILE):
        (run_dir / name).unlink(missing_ok=True)


def _sharded(trainer) -> bool:
    """Checkpoints are sharded (DCP) in a multi-process FSDP2 run."""
    return trainer.dist.enabled and trainer.cfg.train.parallel == "fsdp2"


def _resume(trainer) -> dict:
    """Restore the checkpoint the run context points at (if any), give the engine the restored
    weights, and rewind the run's files. Returns the checkpoint's ``extra`` dict ({} if fresh)."""
    ctx, state = trainer.ctx, trainer.state
    if ctx.resume_from is not None:
        if _sharded(trainer):
            extra = restore_sharded_checkpoint(state, ctx.resume_from)
        else:
            extra = restore_checkpoint(state, ctx.resume_from)
        # The engine was built from the base weights: the first resumed step must not sample
        # from them.
        sync_engine(ctx.engine, state, ctx.named_weights)
        if trainer.step_fn.ahead is not None:  # rollout.max_staleness=1: the batch made ahead
            trainer.step_fn.ahead.load_state_dict(extra.get("lookahead", {}))
        rewind_run_files(ctx.run_dir, state.step)
        trainer.history = [m for m in read_metrics(ctx.run_dir) if m["step"] > 0]
        return extra
    if (ctx.run_dir / "metrics.jsonl").exists():  # train.resume=auto without a checkpoint
        rewind_run_files(ctx.run_dir, -1)
    return {}


def _save(trainer, evaluator) -> Path | None:
    """Checkpoint the train state with the evaluator's state; keep the best-by-eval checkpoint too.

    Several processes: FSDP2 writes a sharded checkpoint (every rank its shard); DDP (every rank
    holds the same weights): rank 0 writes, the others wait.
    """
    best = evaluator.best_step
    args = dict(
        tokenizer=trainer.ctx.processing,
        config_yaml=trainer.cfg.to_yaml(),
        extra={"evaluator": evaluator.state_dict(), **_lookahead_state(trainer)},
        keep=trainer.cfg.train.max_checkpoints,
        protect=[best] if best is not None else [],
    )
    if _sharded(trainer):
        return save_sharded_checkpoint(trainer.state, trainer.ctx.run_dir, **args)
    if trainer.dist.enabled and not trainer.dist.is_main:
        barrier(trainer.dist)
        return None
    path = save_checkpoint(trainer.state, trainer.ctx.run_dir, **args)
    barrier(trainer.dist)
    return path


def _lookahead_state(trainer) -> dict:
    ahead = trainer.step_fn.ahead
    return {"lookahead": ahead.state_dict()} if ahead is not None else {}


def run_training(trainer) -> dict:
    cfg, ctx, state = trainer.cfg, trainer.ctx, trainer.state
    run_dir = ctx.run_dir
    try:
        extra = _resume(trainer)
    except BaseException:
        trainer.engine.close()
        ctx.rewards.close()
        raise
    logger = MetricsLogger(
        run_dir,
        tensorboard=cfg.logging.tensorboard,
        wandb=cfg.logging.wandb,
        wandb_project=cfg.logging.wandb_project,
        run_name=run_dir.name,
    )
    gate = HealthGate(cfg.health)
    for m in trainer.history:  # a resumed run: bring the gate's streak counters back
        gate.check(m["step"], m)
    if gate.events:
        write_health(run_dir, gate.events, None)
    spikes = SpikeLog(run_dir, threshold=cfg.logging.spike_threshold)
    write_status(run_dir, "running")
    main = trainer.dist.is_main
    precision = precision_text(cfg, trainer.ctx.autocast, trainer.ctx.device)
    malloc = describe_allocator(cfg.train.allocator)
    onednn = onednn_cache.in_effect()
    if main:
        ranks = f", processes: {trainer.dist.world_size}" if trainer.dist.enabled else ""
        print(
            f"[rlvr] run directory: {run_dir}  (engine: {trainer.engine.name}, "
            f"objective: {cfg.algo.objective}{ranks})",
            flush=True,
        )
        print(f"[rlvr] precision: {precision}", flush=True)
        print(f"[rlvr] malloc: {malloc}; oneDNN primitive cache: {onednn}", flush=True)
    summary: dict = {
        "run_dir": str(run_dir),
        "engine": trainer.engine.name,
        "objective": cfg.algo.objective,
        "precision": precision,
        "allocator": malloc,
        "onednn_primitive_cache": onednn,
    }
    t_run = time.perf_counter()
    try:
        evaluator = InTrainingEvaluator(
            cfg,
            run_dir=run_dir,
            engine=ctx.engine,
            tokenizer=ctx.tokenizer,
            processor=ctx.processor,
            rewards=ctx.rewards,
            model=ctx.model,
            heldout_rows=ctx.eval_rows,
            train_rows=ctx.train_rows,
            sync=lambda: sync_engine(ctx.engine, state, ctx.named_weights),
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
            logger.log({"step": 0, **before})
            summary["before"] = {k: v for k, v in before.items() if k.startswith("eval/")}
            if main:
                print(f"[rlvr] before training: {_fmt_eval(summary['before'])}", flush=True)
        bar = tqdm(
            range(state.step, cfg.train.max_steps),
            desc="train",
            unit="step",
            disable=not (cfg.logging.progress and main),
            dynamic_ncols=True,
        )
        for _ in bar:
            metrics = trainer.train_step()
            state.step += 1  # the one place the step counter moves
            step = state.step
            metrics = {"step": step, **metrics}
            last = step == cfg.train.max_steps
            scores = evaluator.at_step(step, last)
            metrics.update(scores)
            if last and scores and "before" in summary:
                summary["after"] = {k: v for k, v in scores.items() if k.startswith("eval/")}
            batch = trainer.last_batch
            spikes.maybe_record(
                step, metrics.get("grad_norm_max", 0.0), metrics, batch.prompt_texts
            )
            if cfg.logging.samples_every and step % cfg.logging.samples_every == 0:
                write_samples(run_dir, step, _sample_records(batch))
            logger.log(metrics)
            trainer.history.append(metrics)
            bar.set_postfix(_postfix(metrics), refresh=False)
            events = gate.check(step, metrics)
            for ev in events if main else []:
                tqdm.write(f"[rlvr] health {ev.action}: {ev.rule} at step {ev.step}: {ev.values}")
            stop = first_stop(events)
            if events:
                write_health(run_dir, gate.events, stop)
            if stop is not None:
                raise HealthStop(stop)
            every = cfg.train.save_every
            if every and (step % every == 0 or last or evaluator.stop_reason):
                _save(trainer, evaluator)
            if evaluator.stop_reason:
                atomic_write_text(
                    run_dir / "early_stop.json",
                    json.dumps({"step": step, "reason": evaluator.stop_reason}),
                )
                tqdm.write(f"[rlvr] early stop at step {step}: {evaluator.stop_reason}")
                summary["early_stop"] = evaluator.stop_reason
                break
        summary["final_model"] = str(save_final(trainer))
        summary["wall_time_s"] = time.perf_counter() - t_run
        summary["steps"] = state.step
        atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=1))
        write_status(run_dir, "finished")
        if main:
            _print_summary(summary)
        return summary
    except HealthStop as stop:
        write_status(run_dir, "stopped_by_health", rule=stop.event.rule)
        raise
    except KeyboardInterrupt:
        note = _interrupt_note(trainer)
        write_status(run_dir, "interrupted", step=state.step, checkpoint=note)
        if trainer.dist.is_main:
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
        logger.close()
        if trainer.step_fn.ahead is not None:
            trainer.step_fn.ahead.close()
        trainer.engine.close()
        ctx.rewards.close()


def _interrupt_note(trainer) -> str:
    """Why no checkpoint is written on Ctrl-C, and which one a resume would use.

    An interrupt lands inside a step, whose optimizer may already have stepped on some
    minibatches; saving that half-updated state as "step N" would make resume inexact.
    """
    latest = latest_checkpoint(trainer.ctx.run_dir)
    why = "no checkpoint written on interrupt (the step in progress had half-updated the weights)"
    if latest is None:
        return f"{why}; there is no earlier checkpoint (set train.save_every to keep some)"
    return (
        f"{why}; newest complete checkpoint: step {latest.step}, resume with "
        f"`rlvr train --resume {trainer.ctx.run_dir}`"
    )


def _sample_records(batch: RolloutBatch) -> list[dict]:
    out, k, rewards = [], 0, batch.rewards
    for prompt, row, grp in zip(batch.prompt_texts, batch.rows, batch.groups, strict=True):
        for c in grp:
            out.append(
                {
                    "prompt": prompt,
                    "reference": row["answer"],
                    "response": c.text,
                    "reward": rewards.scores[k],
                    "valid": rewards.valid[k],
                    "info": rewards.infos[k],
                    "finish_reason": c.finish_reason,
                    "tokens": len(c.token_ids),
                }
            )
            k += 1
    return out


def _fmt_eval(scores: dict) -> str:
    return ", ".join(
        f"{k.removeprefix('eval/')} = {v:.3f}" for k, v in scores.items() if isinstance(v, float)
    )


def _print_summary(s: dict) -> None:
    print("\n[rlvr] ---- result ----", flush=True)
    if "before" in s and "after" in s:
        for key, before in s["before"].items():
            if isinstance(before, float) and key in s["after"]:
                name = key.removeprefix("eval/")
                print(f"[rlvr] {name}: {before:.3f} -> {s['after'][key]:.3f}", flush=True)
    print(
        f"[rlvr] steps: {s['steps']}, wall time: {s['wall_time_s']:.0f} s, engine: {s['engine']}",
        flush=True,
    )
    print(f"[rlvr] run directory: {s['run_dir']}", flush=True)
    print(f"[rlvr] final model: {s['final_model']}", flush=True)
