"""Every check of a config before a run, in one place: the config's own cross-knob rules
(`rlvr.config.validate.problems`), then the rules that need other packages (the objective registry and each
objective's own ``check``, loss aggregation names, reward specs, local data paths), then, once
the processes are up, what a multi-process run cannot do. Each message names the knob.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from rlvr.algorithms import AGG_MODES
from rlvr.config import BUILTIN_ENVS, VLLM_ROLLOUT_CORRECTION, Config, ConfigError, validate
from rlvr.data.hub import missing_local
from rlvr.data.rows import reward_specs
from rlvr.distributed import DistInfo
from rlvr.envs.registry import env_class
from rlvr.objectives import OBJECTIVES
from rlvr.rewards.runner import validate_reward_spec
from rlvr.rollout.agents import agent_problems, is_agent_env
from rlvr.rollout.builder import VLLM_KINDS, engine_kind
from rlvr.sandbox import sandbox_problem


def run_dir_taken(run_dir: Path) -> str | None:
    """Why a fresh run may not write into ``run_dir`` (another run's metrics are there), or
    None."""
    if (Path(run_dir) / "metrics.jsonl").exists():
        return (
            f"run directory {run_dir} already holds a run; pick another train.run_name or resume "
            f"it with `rlvr train --resume {run_dir}`"
        )
    return None


def apply_objective_defaults(cfg: Config) -> dict[str, float]:
    """Set, in place, the objective's own defaults (its paper's values: GSPO's clip) of the
    ``algo.*`` knobs that the config does not set itself (not in the section's
    ``model_fields_set``: YAML or overrides named them). Returns what was set, by dotted key."""
    objective = OBJECTIVES.get(cfg.algo.objective)
    if objective is None:
        return {}
    applied = {}
    for key, value in objective.defaults.items():
        if key not in cfg.algo.model_fields_set:
            setattr(cfg.algo, key, value)  # marks it set: applying twice changes nothing
            applied[f"algo.{key}"] = value
    return applied


def off_policy_reason(cfg: Config) -> str | None:
    """Why this run's rollouts are not the trainer's own samples (None: they are): batches
    generated ahead (``rollout.max_staleness``), or vLLM rollouts (`engine_kind`; at config
    time a text model is assumed), whose kernels and bf16 engine differ from the trainer's."""
    k = cfg.rollout.max_staleness
    if k:
        return f"rollout.max_staleness={k}: batches sampled by weights up to {k} versions old"
    if engine_kind(cfg, world_size=1) in VLLM_KINDS:
        return "vLLM rollouts: its kernels differ from the trainer's"
    return None


def apply_engine_defaults(cfg: Config) -> dict[str, str]:
    """Set, in place, the rollout correction ``VLLM_ROLLOUT_CORRECTION`` where the rollouts are
    off-policy (`off_policy_reason`: vLLM's samples, or batches generated ahead), the config
    sets neither ``algo.rollout_correction.level`` nor ``algo.tis_cap``, and the objective takes
    a correction. The hf engine's log-probs on-policy are the trainer's own: nothing to correct.
    Returns what was set, by dotted key."""
    a, rc = cfg.algo, cfg.algo.rollout_correction
    objective = OBJECTIVES.get(a.objective)
    if (
        "level" in rc.model_fields_set
        or a.tis_cap is not None
        or objective is None
        or not objective.takes_correction(cfg)
        or off_policy_reason(cfg) is None
    ):
        return {}
    applied = {}
    for key, value in VLLM_ROLLOUT_CORRECTION.items():
        if key not in rc.model_fields_set:  # an action the user chose is kept
            setattr(rc, key, value)  # marks it set: applying twice changes nothing
            applied[f"algo.rollout_correction.{key}"] = value
    return applied


def correction_off_hint(cfg: Config) -> str:
    """How the run's first lines say the correction in force can be turned off (or why not)."""
    if k := cfg.rollout.max_staleness:
        return f"rollout.max_staleness={k} needs it; rollout.max_staleness=0 to train on-policy"
    knob = (
        "algo.tis_cap=null" if cfg.algo.tis_cap is not None else "algo.rollout_correction.level=off"
    )
    return f"{knob} turns it off"


def _staleness_problems(cfg: Config, objective) -> list[str]:
    """rollout.max_staleness > 0 trains a batch sampled by older weights: without a behaviour
    correction its ratio is exactly 1 (no old-log-prob pass), a gradient biased by the lag."""
    k, a = cfg.rollout.max_staleness, cfg.algo
    if not k or objective is None:
        return []
    knobs = "algo.rollout_correction.level / algo.tis_cap"
    if not objective.takes_correction(cfg):
        return [
            f"rollout.max_staleness={k} with algo.objective={a.objective}: a batch sampled up to "
            f"{k} versions before its update needs a behaviour correction ({knobs}), which "
            f"{a.objective} cannot take (no per-token policy-gradient term); set "
            "rollout.max_staleness=0"
        ]
    if a.correction() is None:
        return [
            f"rollout.max_staleness={k} with algo.rollout_correction.level=off and no "
            f"algo.tis_cap: a batch sampled up to {k} versions before its update would train "
            f"with ratio 1 (a biased gradient); leave {knobs} unset (token truncation at cap 2 "
            "by default), set one, or set rollout.max_staleness=0"
        ]
    return []


def config_problems(cfg: Config) -> list[str]:
    """Every contradiction in ``cfg`` (an empty list when it can run), after the objective's and
    the engine's defaults (checked on a copy: ``cfg`` is left as it is)."""
    cfg = cfg.model_copy(deep=True)
    apply_objective_defaults(cfg)
    apply_engine_defaults(cfg)
    out = validate.problems(cfg)
    a = cfg.algo
    objective = OBJECTIVES.get(a.objective)
    if objective is None:
        close = difflib.get_close_matches(a.objective, list(OBJECTIVES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        out.append(
            f"algo.objective={a.objective!r} is unknown{hint}; known: {', '.join(OBJECTIVES)}"
        )
    if a.loss_agg != "auto" and a.loss_agg not in AGG_MODES:
        out.append(f"algo.loss_agg={a.loss_agg!r} is unknown; known: auto, {', '.join(AGG_MODES)}")
    if objective is not None:
        out.extend(objective.check(cfg))
        if a.correction() is not None and not objective.takes_correction(cfg):
            knob = "algo.tis_cap" if a.tis_cap is not None else "algo.rollout_correction"
            off = "null" if a.tis_cap is not None else "at level=off"
            out.append(
                f"{knob} is not supported by algo.objective={a.objective} (it has no "
                f"per-token policy-gradient term to weight); leave {knob} {off}"
            )
    out.extend(_staleness_problems(cfg, objective))
    out.extend(_env_problems(cfg, objective))
    r = cfg.rollout
    out.extend(_lora_sync_problems(cfg))
    if r.sync_every > 1 and engine_kind(cfg, world_size=1) in VLLM_KINDS:
        out.append(
            f"rollout.sync_every={r.sync_every} with the vLLM engine (rollout.engine / "
            "rollout.mode=server): the engine would sample from weights up to "
            f"{r.sync_every - 1} updates old, which no checkpoint holds, so a resumed run "
            "(train.resume, a stop signal's requeue) would sample from newer weights than the "
            "uninterrupted one; use rollout.sync_every=1"
        )
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
    for i, spec in enumerate(cfg.reward.specs):
        try:
            validate_reward_spec(spec)
        except ValueError as exc:
            out.append(f"reward.specs[{i}]: {exc}")
    out.extend(_sandbox_problems(cfg))
    return out


def _lora_sync_problems(cfg: Config) -> list[str]:
    """``rollout.lora_sync=adapter`` where no adapter would be synced: not a LoRA run, or the hf
    engine (it samples from the trainer's own module; nothing is synced)."""
    if cfg.rollout.lora_sync != "adapter":
        return []
    if not cfg.model.lora.enabled:
        return [
            "rollout.lora_sync=adapter syncs a LoRA adapter, but model.lora.enabled is false; "
            "set model.lora.enabled=true or leave rollout.lora_sync unset (auto)"
        ]
    if engine_kind(cfg, world_size=1) == "hf":
        return [
            f"rollout.lora_sync=adapter needs vLLM rollouts, but the rollout engine is hf "
            f"(rollout.engine={cfg.rollout.engine}; the hf engine samples from the trainer's own "
            "module and syncs nothing); set rollout.engine=vllm or rollout.mode=server, or leave "
            "rollout.lora_sync unset (auto)"
        ]
    return []


def _sandbox_problems(cfg: Config) -> list[str]:
    """The code reward (a reward spec, the task's default, or an eval set's grader: humaneval)
    runs model-written code: refused where no sandbox works (unless sandbox.backend names
    unsafe_local)."""
    graders = [s.grader for s in (es.resolved() for es in cfg.eval.resolved_sets())]
    users = [f"reward {s.name}" for s in reward_specs(cfg) if s.name == "code"]
    users += [f"eval set grader {g}" for g in graders if g == "code"]
    why = sandbox_problem(f"the code reward ({users[0]})", cfg.sandbox.backend) if users else None
    return [why] if why else []  # it names sandbox.backend, what failed and the fixes


def _env_problems(cfg: Config, objective) -> list[str]:
    """env.name: the class must import, and the objective must take episodes."""
    if not cfg.episodes:
        return []
    out = []
    if objective is not None and not objective.takes_episodes(cfg):
        out.append(
            f"algo.objective={cfg.algo.objective} with env.name: not supported yet (its step "
            "scores read one reply's text, an episode has several turns and tool output)"
        )
    if is_agent_env(cfg.env.name):
        out.extend(agent_problems(cfg))
    elif cfg.env.name in (*BUILTIN_ENVS, "openenv") or ":" in cfg.env.name:
        try:
            cls = env_class(cfg.env.name)
        except ValueError as exc:
            out.append(str(exc))
        else:
            if getattr(cls, "runs_model_code", False):  # the Python tool: refused with no sandbox
                why = sandbox_problem(f"env.name={cfg.env.name}", cfg.sandbox.backend)
                out += [why] if why else []
    return out


def check_config(cfg: Config) -> Config:
    """``cfg`` with the objective's and the engine's defaults applied (`apply_objective_defaults`,
    `apply_engine_defaults`, in place) when it can run, else ConfigError listing every problem."""
    apply_objective_defaults(cfg)
    apply_engine_defaults(cfg)
    probs = config_problems(cfg)
    if probs:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(probs))
    return cfg


def distributed_problems(cfg: Config, info: DistInfo) -> list[str]:
    """What a multi-process run cannot do (yet), each naming the knob."""
    if not info.enabled:
        return []
    out = []
    if cfg.algo.prompts_per_step % info.world_size:
        out.append(
            f"algo.prompts_per_step={cfg.algo.prompts_per_step} must be divisible by the number of "
            f"processes ({info.world_size}): each rank takes whole prompt groups"
        )
    elif (cfg.algo.prompts_per_step // info.world_size) % cfg.algo.minibatches:
        out.append(f"algo.minibatches={cfg.algo.minibatches} must divide the prompts per rank")
    tp = cfg.rollout.tensor_parallel_size
    if engine_kind(cfg, world_size=info.world_size) == "vllm_colocated" and info.world_size % tp:
        out.append(
            f"rollout.tensor_parallel_size={tp} must divide the number of processes "
            f"({info.world_size}): each group of that many ranks shares one vLLM engine"
        )
    if cfg.rollout.mode == "server":
        out.append("rollout.mode=server runs with one trainer process for now")
    if cfg.episodes and cfg.train.parallel == "fsdp2":
        out.append(
            "env.name with train.parallel=fsdp2 under several processes: not supported yet "
            "(FSDP2 ranks decode in lockstep, and episodes end after different turns on each "
            "rank); use train.parallel=ddp"
        )
    return out
