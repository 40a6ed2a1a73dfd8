"""The outer loop of a run: evals before and after, steps with telemetry and health, final save."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from tqdm.auto import tqdm

from rlvr.eval.in_training import InTrainingEvaluator
from rlvr.telemetry.health import HealthGate, HealthStop, first_stop, write_health
from rlvr.telemetry.samples import write_samples
from rlvr.telemetry.sinks import MetricsLogger
from rlvr.telemetry.spikes import SpikeLog


def write_status(run_dir: Path, state: str, **extra) -> None:
    """``status.json`` says whether a run finished; a crashed run never looks finished."""
    tmp = run_dir / "status.json.tmp"
    tmp.write_text(json.dumps({"state": state, "time": time.time(), **extra}, indent=1))
    tmp.replace(run_dir / "status.json")


def save_final(trainer) -> Path:
    """HF-format model (or LoRA adapter) + tokenizer under ``run_dir/final``, written atomically."""
    final = trainer.ctx.run_dir / "final"
    tmp = final.with_name("final.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    trainer.model.save_pretrained(tmp)
    trainer.tokenizer.save_pretrained(tmp)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


def _postfix(m: dict) -> dict:
    out = {"reward": f"{m.get('reward_mean', 0):.2f}", "s/step": f"{m.get('time_step', 0):.1f}"}
    if "correct" in m:
        out["correct"] = f"{m['correct']:.2f}"
    if "kl" in m:
        out["kl"] = f"{m['kl']:.3g}"
    out["len"] = f"{m.get('response_len_mean', 0):.0f}"
    return out


def run_training(trainer) -> dict:
    cfg, ctx = trainer.cfg, trainer.ctx
    run_dir = ctx.run_dir
    logger = MetricsLogger(
        run_dir,
        tensorboard=cfg.logging.tensorboard,
        wandb=cfg.logging.wandb,
        wandb_project=cfg.logging.wandb_project,
        run_name=run_dir.name,
    )
    gate = HealthGate(cfg.health)
    spikes = SpikeLog(run_dir, threshold=cfg.logging.spike_threshold)
    write_status(run_dir, "running")
    print(
        f"[rlvr] run directory: {run_dir}  (engine: {trainer.engine.name}, objective: {cfg.algo.objective})",
        flush=True,
    )
    summary: dict = {
        "run_dir": str(run_dir),
        "engine": trainer.engine.name,
        "objective": cfg.algo.objective,
    }
    t_run = time.perf_counter()
    try:
        evaluator = InTrainingEvaluator(trainer)
        before = evaluator.before()
        if before:
            logger.log({"step": 0, **before})
            summary["before"] = {k: v for k, v in before.items() if k.startswith("eval/")}
            print(f"[rlvr] before training: {_fmt_eval(summary['before'])}", flush=True)
        bar = tqdm(
            range(trainer.step, cfg.train.max_steps),
            desc="train",
            unit="step",
            disable=not cfg.logging.progress,
            dynamic_ncols=True,
        )
        for _ in bar:
            metrics = trainer.train_step()
            trainer.step += 1
            step = trainer.step
            metrics = {"step": step, **metrics}
            last = step == cfg.train.max_steps
            scores = evaluator.at_step(step, last)
            metrics.update(scores)
            if last and scores and "before" in summary:
                summary["after"] = {k: v for k, v in scores.items() if k.startswith("eval/")}
            prompts, rows, groups, rewards = trainer._last_batch
            spikes.maybe_record(step, metrics.get("grad_norm_max", 0.0), metrics, prompts)
            if cfg.logging.samples_every and step % cfg.logging.samples_every == 0:
                write_samples(run_dir, step, _sample_records(prompts, rows, groups, rewards))
            logger.log(metrics)
            trainer.history.append(metrics)
            bar.set_postfix(_postfix(metrics), refresh=False)
            events = gate.check(step, metrics)
            for ev in events:
                tqdm.write(f"[rlvr] health {ev.action}: {ev.rule} at step {ev.step}: {ev.values}")
            stop = first_stop(events)
            if events:
                write_health(run_dir, gate.events, stop)
            if stop is not None:
                raise HealthStop(stop)
            if evaluator.stop_reason:
                (run_dir / "early_stop.json").write_text(
                    json.dumps({"step": step, "reason": evaluator.stop_reason})
                )
                tqdm.write(f"[rlvr] early stop at step {step}: {evaluator.stop_reason}")
                summary["early_stop"] = evaluator.stop_reason
                break
        summary["final_model"] = str(save_final(trainer))
        summary["wall_time_s"] = time.perf_counter() - t_run
        summary["steps"] = trainer.step
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        write_status(run_dir, "finished")
        _print_summary(summary)
        return summary
    except HealthStop as stop:
        write_status(run_dir, "stopped_by_health", rule=stop.event.rule)
        raise
    except KeyboardInterrupt:
        write_status(run_dir, "interrupted", step=trainer.step)
        raise
    except BaseException as exc:
        write_status(run_dir, "failed", error=f"{type(exc).__name__}: {exc}", step=trainer.step)
        raise
    finally:
        logger.close()
        trainer.engine.close()
        ctx.rewards.close()


def _sample_records(prompts, rows, groups, rewards) -> list[dict]:
    out, k = [], 0
    for prompt, row, grp in zip(prompts, rows, groups, strict=True):
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
        f"{k.split('/')[-1]} = {v:.3f}" for k, v in scores.items() if isinstance(v, float)
    )


def _print_summary(s: dict) -> None:
    print("\n[rlvr] ---- result ----", flush=True)
    if "before" in s and "after" in s:
        for key, before in s["before"].items():
            if isinstance(before, float) and key in s["after"]:
                name = key.split("/")[-1]
                print(f"[rlvr] held-out {name}: {before:.3f} -> {s['after'][key]:.3f}", flush=True)
    print(
        f"[rlvr] steps: {s['steps']}, wall time: {s['wall_time_s']:.0f} s, engine: {s['engine']}",
        flush=True,
    )
    print(f"[rlvr] run directory: {s['run_dir']}", flush=True)
    print(f"[rlvr] final model: {s['final_model']}", flush=True)
