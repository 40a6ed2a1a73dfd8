"""The checks that relate knobs to each other within the config: ``problems(cfg)`` lists them,
``check(cfg)`` raises on any.

Each message names the knob and the rule it breaks. Checks that need another package (an
objective's own rules from its registry, reward specs, data paths, loss aggregation names) live in
`rlvr.training.preflight.checks`, which runs these first: config stays a leaf. The rules read the
sections (`rlvr.config.sections`), which do not import them back.
"""

from __future__ import annotations

from pathlib import Path

from rlvr.config.base import ConfigError
from rlvr.config.env import env_problems
from rlvr.config.sections import Config

TASKS = ("arithmetic", "countdown", "shapes", "calc_tool", "code_fn", "file")


def problems(cfg: Config) -> list[str]:
    """The contradictions among ``cfg``'s own knobs (an empty list when there are none), each
    naming the knob and the rule it breaks (a run checks more:
    `rlvr.training.preflight.checks.config_problems`)."""
    out: list[str] = []
    a = cfg.algo
    if a.group_size <= 1:
        out.append(f"algo.group_size={a.group_size}: must be > 1 (group baselines need 2+ samples)")
    if a.prompts_per_step < 1:
        out.append(f"algo.prompts_per_step={a.prompts_per_step}: must be >= 1")
    if a.prompts_per_step >= 1 and a.prompts_per_step % a.minibatches:
        out.append(
            f"algo.minibatches={a.minibatches} must divide algo.prompts_per_step={a.prompts_per_step} "
            "(minibatches hold whole prompt groups)"
        )
    if a.dual_clip is not None and a.dual_clip <= 1.0:
        out.append(f"algo.dual_clip={a.dual_clip}: must be > 1 (or null)")
    if a.kl_target is not None and a.beta <= 0:
        out.append("algo.kl_target is set but algo.beta=0: adaptive KL needs a starting beta > 0")
    rc = a.rollout_correction
    if a.tis_cap is not None and rc.level != "off":
        out.append(
            "algo.tis_cap and algo.rollout_correction are both set: algo.tis_cap=C is "
            "algo.rollout_correction level=token action=truncate cap=C; keep one"
        )
    if rc.action in ("mask", "reject") and rc.level != "off":
        low, high = rc.bounds()
        if not low < 1.0 < high:
            out.append(
                f"algo.rollout_correction: the mask keeps ratios in [low={low:g}, cap={high:g}], "
                "which must contain 1 (low < 1 < cap)"
            )
    if rc.low is not None and rc.action == "truncate":
        out.append(
            "algo.rollout_correction.low is the mask's lower bound: set action=mask (or reject)"
        )
    if cfg.reward.overlong_buffer > cfg.rollout.max_new_tokens:
        out.append(
            f"reward.overlong_buffer={cfg.reward.overlong_buffer} must be <= "
            f"rollout.max_new_tokens={cfg.rollout.max_new_tokens} (the penalty ramps over the last "
            "overlong_buffer tokens before the limit)"
        )
    if cfg.rollout.mode == "server" and cfg.rollout.engine == "hf":
        out.append("rollout.mode=server serves vLLM: set rollout.engine=vllm (or auto)")
    if cfg.rollout.partial and (cfg.rollout.mode != "server" or cfg.rollout.max_staleness < 1):
        out.append(
            "rollout.partial=true continues generations ahead across weight pushes: it needs "
            f"rollout.mode=server and rollout.max_staleness >= 1 (got mode={cfg.rollout.mode}, "
            f"max_staleness={cfg.rollout.max_staleness})"
        )
    if cfg.rollout.engine == "hf" and cfg.rollout.sleep_during_update:
        out.append("rollout.sleep_during_update needs rollout.engine=vllm")
    if cfg.data.task == "file" and not cfg.data.train_path:
        alone = cfg.data.eval_path
        out.append(
            "data.task=file needs data.train_path"
            + (
                f"; to train on a built-in task and grade on {alone}, drop data.eval_path and "
                f"add eval.sets=[{{name: {Path(alone).stem}, path: {alone}}}]"
                if alone
                else ""
            )
        )
    given = [k for k in ("train_path", "eval_path") if getattr(cfg.data, k)]
    if cfg.data.task != "file" and given:
        paths = " and ".join(f"data.{k}" for k in given)
        out.append(
            f"data.task={cfg.data.task} generates its own rows, so {paths} would be ignored: "
            f"drop data.task (a data path alone means data.task=file) or drop {paths} (a "
            "further held-out file: eval.sets with a path)"
        )
    if cfg.data.task == "shapes" and cfg.data.template != "chat":
        out.append(
            f"data.task=shapes with data.template={cfg.data.template}: image rows need "
            "data.template=chat (the processor's chat template places the images)"
        )
    prefixed = cfg.data.task.partition(":")
    plugin = prefixed[0] in ("reasoning_gym", "verifiers") and prefixed[2]
    if cfg.data.task not in TASKS and not plugin:
        out.append(
            f"data.task={cfg.data.task!r} is unknown; known: {', '.join(TASKS)}, "
            "reasoning_gym:<task> (the extra rlvr[reasoning-gym]) or verifiers:<module> "
            "(the extra rlvr[agents])"
        )
    out.extend(env_problems(cfg))
    b1, b2 = cfg.train.adam_betas
    if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
        out.append(f"train.adam_betas={list(cfg.train.adam_betas)}: each beta must be in [0, 1)")
    if cfg.train.warmup_steps >= cfg.train.max_steps and cfg.train.schedule != "constant":
        out.append(
            f"train.warmup_steps={cfg.train.warmup_steps} >= train.max_steps={cfg.train.max_steps}: "
            "the run would end before reaching its peak learning rate"
        )
    return out


def check(cfg: Config) -> Config:
    """``cfg``, or ConfigError listing ``problems(cfg)``."""
    probs = problems(cfg)
    if probs:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(probs))
    return cfg
