"""Every check that relates knobs to each other, in one place; `Config.validate()` runs it.

Each message names the knob and the rule it breaks. An objective's own rules live in its file
(`rlvr.objectives`, method ``check``); this module asks the registry for them, so it imports the
objectives (and torch) when called, never when `rlvr.config` is imported.
"""

from __future__ import annotations

import difflib

from rlvr.config.sections import Config

TASKS = ("arithmetic", "countdown", "shapes", "file")


def problems(cfg: Config) -> list[str]:
    """Every contradiction in ``cfg`` (an empty list when it can run)."""
    from rlvr.algorithms import AGG_MODES
    from rlvr.data.hub import missing_local
    from rlvr.objectives import OBJECTIVES
    from rlvr.rewards.runner import validate_reward_spec

    out: list[str] = []
    a = cfg.algo
    objective = OBJECTIVES.get(a.objective)
    if objective is None:
        close = difflib.get_close_matches(a.objective, list(OBJECTIVES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        out.append(
            f"algo.objective={a.objective!r} is unknown{hint}; known: {', '.join(OBJECTIVES)}"
        )
    if a.group_size <= 1:
        out.append(f"algo.group_size={a.group_size}: must be > 1 (group baselines need 2+ samples)")
    if a.prompts_per_step < 1:
        out.append(f"algo.prompts_per_step={a.prompts_per_step}: must be >= 1")
    if a.prompts_per_step >= 1 and a.prompts_per_step % a.minibatches:
        out.append(
            f"algo.minibatches={a.minibatches} must divide algo.prompts_per_step={a.prompts_per_step} "
            "(minibatches hold whole prompt groups)"
        )
    if a.loss_agg != "auto" and a.loss_agg not in AGG_MODES:
        out.append(f"algo.loss_agg={a.loss_agg!r} is unknown; known: auto, {', '.join(AGG_MODES)}")
    if a.dual_clip is not None and a.dual_clip <= 1.0:
        out.append(f"algo.dual_clip={a.dual_clip}: must be > 1 (or null)")
    if a.kl_target is not None and a.beta <= 0:
        out.append("algo.kl_target is set but algo.beta=0: adaptive KL needs a starting beta > 0")
    if objective is not None:
        out.extend(objective.check(cfg))
        if a.tis_cap is not None and not objective.supports_tis:
            out.append(
                f"algo.tis_cap is not supported by algo.objective={a.objective} (it has no "
                "per-token policy-gradient term to weight); leave algo.tis_cap null"
            )
    if cfg.reward.overlong_buffer > cfg.rollout.max_new_tokens:
        out.append(
            f"reward.overlong_buffer={cfg.reward.overlong_buffer} must be <= "
            f"rollout.max_new_tokens={cfg.rollout.max_new_tokens} (the penalty ramps over the last "
            "overlong_buffer tokens before the limit)"
        )
    if cfg.rollout.mode == "server" and cfg.rollout.engine == "hf":
        out.append("rollout.mode=server serves vLLM: set rollout.engine=vllm (or auto)")
    if cfg.rollout.engine == "hf" and cfg.rollout.sleep_during_update:
        out.append("rollout.sleep_during_update needs rollout.engine=vllm")
    if cfg.data.task == "file" and not cfg.data.train_path:
        out.append("data.task=file needs data.train_path")
    for key, p in (
        ("data.train_path", cfg.data.train_path),
        ("data.eval_path", cfg.data.eval_path),
    ):
        if p and (why := missing_local(p)):
            out.append(f"{key}: {why}")
    for i, es in enumerate(cfg.eval.sets):
        if es.path and (why := missing_local(es.path)):
            out.append(f"eval.sets[{i}] ({es.name}): {why}")
        if es.grader is not None:
            try:
                validate_reward_spec({"name": es.grader})
            except ValueError as exc:
                out.append(f"eval.sets[{i}] ({es.name}).grader: {exc}")
    if cfg.data.task == "shapes" and cfg.data.template != "chat":
        out.append(
            f"data.task=shapes with data.template={cfg.data.template}: image rows need "
            "data.template=chat (the processor's chat template places the images)"
        )
    if cfg.data.task not in TASKS:
        out.append(f"data.task={cfg.data.task!r} is unknown; known: {', '.join(TASKS)}")
    for i, spec in enumerate(cfg.reward.specs):
        try:
            validate_reward_spec(spec)
        except ValueError as exc:
            out.append(f"reward.specs[{i}]: {exc}")
    b1, b2 = cfg.train.adam_betas
    if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
        out.append(f"train.adam_betas={list(cfg.train.adam_betas)}: each beta must be in [0, 1)")
    if cfg.train.warmup_steps >= cfg.train.max_steps and cfg.train.schedule != "constant":
        out.append(
            f"train.warmup_steps={cfg.train.warmup_steps} >= train.max_steps={cfg.train.max_steps}: "
            "the run would end before reaching its peak learning rate"
        )
    return out
