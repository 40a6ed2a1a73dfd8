"""The pieces around the training loop that `Trainer.fit` runs: the run's status file, resume
(restore, sync the engine, rewind the run's files), checkpoints (every ``train.save_every`` steps,
at the end, sharded under FSDP2), the final save, and what the run prints. Each takes the run's
parts explicitly (`Run`, `TrainState`, `Step`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rlvr.checkpoint.full import latest_checkpoint, restore_checkpoint, save_checkpoint
from rlvr.checkpoint.sharded import restore_sharded_checkpoint, save_sharded_checkpoint
from rlvr.config import Config
from rlvr.data.templates import asks_for_boxed
from rlvr.distributed import barrier, full_state_dict
from rlvr.eval.in_training import InTrainingEvaluator
from rlvr.eval.reply_stats import TRUNCATED
from rlvr.jsonio import atomic_write_text, dumps_line, read_jsonl
from rlvr.model.loading import save_model_folder
from rlvr.objectives.batch import RolloutBatch
from rlvr.rollout.episodes import episode_scores
from rlvr.telemetry.health import HEALTH_EVENTS_FILE, HEALTH_FILE, HealthGate
from rlvr.telemetry.samples import list_sample_steps, samples_path
from rlvr.telemetry.sinks import read_metrics, truncate_metrics
from rlvr.telemetry.spikes import SPIKES_FILE
from rlvr.training.memory import memory_lines
from rlvr.training.overlap import sync_engine
from rlvr.training.preempt import Preempted, StopSignals
from rlvr.training.setup import Run
from rlvr.training.state import TrainState
from rlvr.training.step import Step


def write_status(run_dir: Path, state: str, **extra) -> None:
    """``status.json`` says whether a run finished; a crashed run never looks finished."""
    payload = {"state": state, "time": time.time(), **extra}
    atomic_write_text(run_dir / "status.json", json.dumps(payload, indent=1))


def save_final(run: Run) -> Path:
    """HF-format model (or LoRA adapter) + tokenizer under ``run_dir/final``, written atomically.

    With several processes every rank takes part in gathering the full weights; rank 0 writes.
    """
    final = run.run_dir / "final"
    info, model = run.dist, run.model
    state = full_state_dict(model, info) if info.enabled else None
    if state is not None and getattr(model.config, "tie_word_embeddings", False):
        # gathered tensors no longer share storage; drop the tied copies save_pretrained would keep
        for key in getattr(model, "all_tied_weights_keys", None) or {}:
            state.pop(key, None)
    if info.enabled and not info.is_main:
        return final
    return save_model_folder(  # a VLM's processor saves its tokenizer with it
        model, run.processing, final, state_dict=state, replace=True
    )


def health_gate(run: Run) -> HealthGate:
    """The run's health gate, without the rules that cannot apply to it: ``has_boxed`` only
    where the prompts ask for a boxed answer (a task that never asks cannot lose the format)."""
    d = run.cfg.data
    boxed = asks_for_boxed(run.train_rows, d.template, run.tokenizer, d.system_prompt)
    return HealthGate(run.cfg.health, not_applicable=() if boxed else ("has_boxed",))


def postfix(m: dict) -> dict:
    """The progress bar's figures of one step."""
    out = {"reward": f"{m.get('reward_mean', 0):.2f}", "s/step": f"{m.get('time_step', 0):.1f}"}
    if "correct" in m:
        out["correct"] = f"{m['correct']:.2f}"
    if m.get("reward_failure_rate"):  # replies whose reward raised: scored nothing
        out["reward_failed"] = f"{m['reward_failure_rate']:.0%}"
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


def _sharded(run: Run) -> bool:
    """Checkpoints are sharded (DCP) in a multi-process FSDP2 run."""
    return run.dist.enabled and run.cfg.train.parallel == "fsdp2"


def resume(run: Run, state: TrainState, step: Step) -> tuple[dict, list[dict]]:
    """Restore the checkpoint the run points at (if any), give the engine the restored weights,
    and rewind the run's files. Returns the checkpoint's ``extra`` dict ({} if fresh) and the
    metrics of the steps already run."""
    if run.resume_from is not None:
        if _sharded(run):
            extra = restore_sharded_checkpoint(state, run.resume_from)
        else:
            extra = restore_checkpoint(state, run.resume_from)
        # The engine was built from the base weights: the first resumed step must not sample
        # from them.
        sync_engine(run.engine, state, run.named_weights)
        step.load_state_dict(extra)  # rollout.max_staleness=k: the batches made ahead
        rewind_run_files(run.run_dir, state.step)
        return extra, [m for m in read_metrics(run.run_dir) if m["step"] > 0]
    if (run.run_dir / "metrics.jsonl").exists():  # train.resume=auto without a checkpoint
        rewind_run_files(run.run_dir, -1)
    return {}, []


def save(
    run: Run,
    state: TrainState,
    step: Step,
    evaluator: InTrainingEvaluator,
    *,
    stopping: bool = False,
) -> Path | None:
    """Checkpoint the train state with the evaluator's and the step's state; keep the
    best-by-eval checkpoint too. ``stopping``: a stop signal's checkpoint, the run's last (of the
    batches generated ahead, only the finished ones: ``Step.state_dict``).

    Several processes: FSDP2 writes a sharded checkpoint (every rank its shard); DDP (every rank
    holds the same weights): rank 0 writes, the others wait.
    """
    best = evaluator.best_step
    args = dict(
        tokenizer=run.processing,
        config_yaml=run.cfg.to_yaml(),
        extra={"evaluator": evaluator.state_dict(), **step.state_dict(stopping=stopping)},
        keep=run.cfg.train.max_checkpoints,
        protect=[best] if best is not None else [],
    )
    if _sharded(run):
        return save_sharded_checkpoint(state, run.run_dir, **args)
    if run.dist.enabled and not run.dist.is_main:
        barrier(run.dist)
        return None
    path = save_checkpoint(state, run.run_dir, **args)
    barrier(run.dist)
    return path


def interrupt_note(run_dir: Path) -> str:
    """Why no checkpoint is written on Ctrl-C, and which one a resume would use.

    An interrupt lands inside a step, whose optimizer may already have stepped on some
    minibatches; saving that half-updated state as "step N" would make resume inexact.
    """
    latest = latest_checkpoint(run_dir)
    why = "no checkpoint written on interrupt (the step in progress had half-updated the weights)"
    if latest is None:
        return f"{why}; there is no earlier checkpoint (set train.save_every to keep some)"
    return (
        f"{why}; newest complete checkpoint: step {latest.step}, resume with "
        f"`rlvr train --resume {run_dir}`"
    )


def save_on_stop(
    run: Run,
    state: TrainState,
    step: Step,
    evaluator: InTrainingEvaluator | None,
    stop: Preempted,
    stops: StopSignals,
) -> str:
    """The checkpoint of the last finished step when a stop signal ends the run (written unless
    a periodic save already wrote it); returns what status.json and the terminal say of it."""
    if stop.half_updated:
        why = (
            f"no checkpoint written: the update under way did not finish within "
            f"train.stop_grace_s={run.cfg.train.stop_grace_s:g}"
        )
        latest = latest_checkpoint(run.run_dir)
        return f"{why}; newest complete checkpoint: " + (
            f"step {latest.step}" if latest else "none"
        )
    if stop.abandoned:
        stops.rewind(state)  # the abandoned rollout drew prompts and random numbers
    if evaluator is None:
        return "no checkpoint needed: no step had finished"
    return checkpoint_last_step(run, state, step, evaluator, stopping=True)


def checkpoint_last_step(
    run: Run,
    state: TrainState,
    step: Step,
    evaluator: InTrainingEvaluator,
    *,
    stopping: bool = False,
) -> str:
    """A complete checkpoint of the last finished step (written unless the newest is already
    that step's), so a run that stops early keeps its work; the line that says where."""
    if state.step == 0:
        return "no checkpoint needed: no step had finished"
    latest = latest_checkpoint(run.run_dir)
    if latest is None or latest.step != state.step:
        save(run, state, step, evaluator, stopping=stopping)
        latest = latest_checkpoint(run.run_dir)
    return f"checkpoint of step {state.step}: {latest.path if latest else '?'}"


def sample_records(batch: RolloutBatch) -> list[dict]:
    """The records of ``samples/step_N.jsonl``: every completion of the batch with its reward
    (an episode's as the step counted it: the environment's where it gives the reward)."""
    out, k, rewards = [], 0, batch.rewards
    scores, valid = episode_scores(batch.completions, rewards.scores, rewards.valid)
    for prompt, row, grp in zip(batch.prompt_texts, batch.rows, batch.groups, strict=True):
        for c in grp:
            out.append(
                {
                    "prompt": prompt,
                    "reference": row["answer"],
                    "response": c.text,
                    "reward": scores[k],
                    "valid": valid[k],
                    "reward_error": rewards.error(k),
                    "info": rewards.infos[k],
                    "finish_reason": c.finish_reason,
                    "tokens": len(c.token_ids),
                    **_episode_record(c.episode),
                }
            )
            k += 1
    return out


def _episode_record(ep) -> dict:
    """An episode's turns one by one (model / environment), its token split and any failure."""
    if ep is None:
        return {}
    return {
        "turns": [{"role": role, "text": text} for role, text in ep.transcript],
        "model_tokens": ep.model_tokens,
        "env_tokens": ep.env_tokens,
        "tool_calls": ep.tool_calls,
        "env_reward": ep.env_reward,
        "env_failed": ep.failed,
    }


def data_line(cfg: Config, train_rows: list[dict], eval_rows: list[dict]) -> str:
    """Where the run's rows come from, said on its first lines."""
    d = cfg.data
    if d.task != "file":
        return f"built-in task {d.task!r}: {len(train_rows)} train rows, {len(eval_rows)} held-out"
    held = (
        f"{len(eval_rows)} held-out rows from {d.eval_path}"
        if d.eval_path
        else "no held-out rows (data.eval_path unset: no evaluation before and after)"
    )
    return (
        f"{len(train_rows)} train rows from {d.train_path}, {held} (fields: prompt "
        f"{d.prompt_field!r}, answer {d.answer_field!r})"
    )


def truncation_notes(cfg: Config, scores: dict) -> list[str]:
    """What an evaluation's truncated shares say before training starts: each set and mode whose
    replies hit the token limit more often than health.truncation.max_rate, with the knob."""
    rule = cfg.health.truncation
    limit = cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
    knob = (
        f"eval.max_new_tokens={limit}"
        if cfg.eval.max_new_tokens
        else f"rollout.max_new_tokens={limit} (eval.max_new_tokens unset: the same limit)"
    )
    out = []
    for key, value in scores.items():
        if key.endswith(f"/{TRUNCATED}") and isinstance(value, float) and value > rule.max_rate:
            where = key.removeprefix("eval/").removesuffix(f"/{TRUNCATED}")
            out.append(
                f"{value:.0%} of the replies of the evaluation before training ({where}) hit "
                f"the token limit, {knob}: their answers are cut before they are written. "
                "Raise rollout.max_new_tokens (training) and eval.max_new_tokens (evaluation)."
            )
    return out


def fmt_eval(scores: dict) -> str:
    return ", ".join(
        f"{k.removeprefix('eval/')} = {v:.3f}" for k, v in scores.items() if isinstance(v, float)
    )


def print_summary(s: dict) -> None:
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
    for line in memory_lines(s["memory"]) if "memory" in s else []:
        print(f"[rlvr] {line}", flush=True)
    print(f"[rlvr] run directory: {s['run_dir']}", flush=True)
    print(f"[rlvr] final model: {s['final_model']}", flush=True)
