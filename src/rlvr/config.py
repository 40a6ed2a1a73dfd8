"""Typed run configuration: YAML file + dotted command-line overrides, checked before any model loads.

    cfg = load_config("run.yaml", ["algo.group_size=4", "train.lr=2e-6"])
    problems = cfg.problems()        # every contradiction, each naming its knob and rule
    cfg.validate()                   # raises ConfigError listing them

Unknown keys are an error that names the key and suggests the closest valid one.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError

from rlvr.config_base import Section
from rlvr.eval.config import EvalConfig
from rlvr.rewards.runner import RewardSpec
from rlvr.telemetry.health_config import HealthConfig
from rlvr.training.lora_config import LoraConfig

OBJECTIVES = ("drgrpo", "grpo", "rloo", "ppo", "maxent_listwise", "psgrpo_steps")
TEMPLATES = ("chat", "r1", "qwen_math", "none")


class ConfigError(ValueError):
    """A configuration that cannot run; the message names each bad knob."""


class ModelConfig(Section):
    name_or_path: str = Field(
        "smollm2-135m-instruct",
        description="Hub id, local HF folder, .gguf file, or 'smollm2-135m-instruct' (embedded default).",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Weight dtype. Keep float32 master weights; speed comes from autocast.",
    )
    autocast: Literal["auto", "bf16", "off"] = Field(
        "auto",
        description="bf16 autocast for forward passes: 'auto' uses it where the device supports it.",
    )
    device: str = Field(
        "auto", description="'auto' (cuda if available, else cpu), 'cpu', 'cuda', ..."
    )
    attention: Literal["auto", "eager", "sdpa"] = Field(
        "auto",
        description="Attention kernel of the trained model. 'auto': eager on the CPU for short "
        "replies (rollout.max_new_tokens <= 256: its backward is ~10% faster than SDPA's there), "
        "else SDPA (eager keeps a T x T score matrix per head for the backward).",
    )
    gradient_checkpointing: bool = False
    lora: LoraConfig = Field(default_factory=LoraConfig)


class DataConfig(Section):
    task: str = Field(
        "arithmetic",
        description="Built-in task ('arithmetic', 'countdown') or 'file' to read train_path/eval_path.",
    )
    task_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Options of the built-in task generator (e.g. ops, digits).",
    )
    num_train: int = Field(
        2000, gt=0, description="Rows generated for a built-in task's train split."
    )
    num_eval: int = Field(
        100, gt=0, description="Rows generated for a built-in task's held-out split."
    )
    train_path: str | None = None
    eval_path: str | None = None
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    system_prompt: str | None = None
    template: Literal["chat", "r1", "qwen_math", "none"] = Field(
        "chat", description="How a problem becomes the text the model sees."
    )
    max_prompt_tokens: int = Field(256, gt=0, description="Prompts longer than this are an error.")
    seed: int = 0


class RolloutConfig(Section):
    engine: Literal["hf", "vllm", "auto"] = Field(
        "auto", description="'hf' (transformers generate), 'vllm', or 'auto' (vllm when installed)."
    )
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 disables top-k.")
    max_new_tokens: int = Field(48, gt=0)
    stop: list[str] = Field(
        default_factory=list, description="Stop strings (kept in the completion)."
    )
    batch_size: int = Field(
        64, gt=0, description="Sequences generated per generate() call (hf engine)."
    )
    # vLLM knobs (ignored by the hf engine)
    gpu_memory_utilization: float = Field(0.3, gt=0.0, le=1.0)
    tensor_parallel_size: int = Field(1, ge=1)
    enforce_eager: bool = True
    sync_every: int = Field(
        1, ge=1, description="Push trained weights to the engine every N steps."
    )
    sleep_during_update: bool = Field(False, description="vLLM sleep/wake around the update (GPU).")
    seed_per_prompt: bool = Field(
        False,
        description="Seed each prompt's samples separately (slower on the hf engine: one generate call "
        "per prompt), so a run draws the same completions whatever the process count.",
    )


class MaxEntConfig(Section):
    tau: float = Field(0.5, description="Entropy temperature tau of the listwise target.")
    q_temperature: float = Field(2.0, description="Temperature of q = softmax(r / q_temperature).")
    q_eps: float = Field(1e-6, description="Floor of q: q <- q (1 - K q_eps) + q_eps.")
    length_normalize_ref: bool = True
    length_normalize_policy: bool = True
    skip_zero_variance_groups: bool = True
    use_clip_objective: bool = True
    clip_objective_coef: float = 1.0


class PPOConfig(Section):
    value_lr: float = Field(1e-5, gt=0)
    value_clip: float = Field(0.2, gt=0)
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(0.95, ge=0, le=1)
    value_coef: float = Field(1.0, gt=0)


class PSGRPOStepsConfig(Section):
    prm: str | None = Field(
        None,
        description="PRM for objective psgrpo_steps: token-classification model folder or 'pkg.mod:fn'.",
    )
    step_pattern: str = Field(r"^Step \d+:", description="Regex (multiline) that starts a step.")
    answer_pattern: str = Field(r"^†Answer:", description="Regex of the final answer line.")
    tag_token: str = Field(
        "ки", description="Token the HF PRM scores after each step (URSA style)."
    )
    label_index: int = 0


class AlgoConfig(Section):
    objective: str = Field("drgrpo", description=f"One of {', '.join(OBJECTIVES)}.")
    group_size: int = Field(8, description="Samples per prompt (G).")
    prompts_per_step: int = Field(
        4, description="Prompts per rollout batch; the batch is prompts x G."
    )
    minibatches: int = Field(1, ge=1, description="Optimizer steps per rollout batch (per epoch).")
    epochs_per_batch: int = Field(
        1, ge=1, description="Passes over each rollout batch (PPO epochs)."
    )
    micro_batch_size: int = Field(
        8,
        ge=1,
        description="Most sequences per forward/backward pass (sequences are grouped by length).",
    )
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="Most padded positions (rows x longest prompt+completion) per forward/backward "
        "pass; caps activation memory when lengths vary. None: micro_batch_size alone.",
    )
    clip_low: float = Field(0.2, ge=0.0)
    clip_high: float = Field(
        0.2, ge=0.0, description="Set above clip_low for clip-higher (e.g. 0.28)."
    )
    dual_clip: float | None = Field(None, description="Dual-clip constant c > 1, or None.")
    log_ratio_clamp: float = Field(20.0, gt=0)
    loss_agg: str = Field(
        "auto",
        description="token_mean | seq_mean_token_mean | seq_mean_token_sum_norm; 'auto' picks the objective's own.",
    )
    beta: float = Field(0.0, ge=0.0, description="KL coefficient; > 0 loads a reference policy.")
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    kl_mode: Literal["loss", "reward"] = "loss"
    kl_target: float | None = Field(None, description="Adaptive KL target; None keeps beta fixed.")
    kl_horizon: int = 10000
    entropy_coef: float = 0.0
    adv_eps: float = 1e-6
    maxent: MaxEntConfig = Field(default_factory=MaxEntConfig)
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    psgrpo: PSGRPOStepsConfig = Field(default_factory=PSGRPOStepsConfig)


class TrainConfig(Section):
    lr: float = Field(2e-5, gt=0)
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0)
    weight_decay: float = Field(0.0, ge=0.0)
    adam_betas: tuple[float, float] = Field(
        (0.9, 0.999), description="AdamW betas, each in [0, 1)."
    )
    max_grad_norm: float = Field(1.0, gt=0)
    max_steps: int = Field(20, gt=0, description="Training steps (rollout batches).")
    seed: int = 0
    output_dir: str = "runs"
    run_name: str | None = Field(None, description="Default: <objective>-<task>-<time>.")
    save_every: int = Field(
        0, ge=0, description="Checkpoint every N steps (0: only the final model)."
    )
    max_checkpoints: int = Field(2, ge=1)
    resume: str | None = Field(
        None,
        description="'auto' (newest complete checkpoint of run_name, if any) or a run directory.",
    )
    threads: int = Field(0, ge=0, description="torch threads; 0 leaves torch's default.")
    parallel: Literal["fsdp2", "ddp"] = Field(
        "fsdp2",
        description="How several processes (torchrun) share the model: FSDP2 shards, DDP replicates.",
    )
    preflight_step: int = Field(20, ge=0, description="Pre-flight: check the LR at this step...")
    preflight_min_fraction: float = Field(
        0.3, gt=0.0, le=1.0, description="...is at least this x peak."
    )


class LoggingConfig(Section):
    samples_every: int = Field(
        5, ge=0, description="Write sampled completions every N steps (0: never)."
    )
    spike_threshold: float = Field(50.0, gt=0)
    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str | None = None
    progress: bool = True


class RewardConfig(Section):
    specs: list[RewardSpec] = Field(
        default_factory=list,
        description="Rewards and weights; empty picks the task's own reward (math / countdown).",
    )
    timeout_s: float = Field(5.0, gt=0)
    max_failure_fraction: float = Field(0.5, ge=0.0, le=1.0)


class Config(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)

    # ------------------------------------------------------------------ derived values
    def loss_agg_mode(self) -> str:
        if self.algo.loss_agg != "auto":
            return self.algo.loss_agg
        return {"grpo": "seq_mean_token_mean", "ppo": "token_mean"}.get(
            self.algo.objective, "seq_mean_token_sum_norm"
        )

    def rollout_batch_sequences(self) -> int:
        return self.algo.prompts_per_step * self.algo.group_size

    def run_name(self) -> str:
        import time

        return self.train.run_name or (
            f"{self.algo.objective}-{self.data.task}-{time.strftime('%Y%m%d-%H%M%S')}"
        )

    # ------------------------------------------------------------------ guardrails
    def problems(self) -> list[str]:
        """Every contradiction in this config, each naming the knob and the rule it breaks."""
        from rlvr.algorithms import AGG_MODES
        from rlvr.rewards.runner import validate_reward_spec

        out: list[str] = []
        a = self.algo
        if a.objective not in OBJECTIVES:
            close = difflib.get_close_matches(a.objective, OBJECTIVES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            out.append(
                f"algo.objective={a.objective!r} is unknown{hint}; known: {', '.join(OBJECTIVES)}"
            )
        if a.group_size <= 1:
            out.append(
                f"algo.group_size={a.group_size}: must be > 1 (group baselines need 2+ samples)"
            )
        if a.prompts_per_step < 1:
            out.append(f"algo.prompts_per_step={a.prompts_per_step}: must be >= 1")
        if a.prompts_per_step >= 1 and a.prompts_per_step % a.minibatches:
            out.append(
                f"algo.minibatches={a.minibatches} must divide algo.prompts_per_step={a.prompts_per_step} "
                "(minibatches hold whole prompt groups)"
            )
        if a.loss_agg != "auto" and a.loss_agg not in AGG_MODES:
            out.append(
                f"algo.loss_agg={a.loss_agg!r} is unknown; known: auto, {', '.join(AGG_MODES)}"
            )
        if a.dual_clip is not None and a.dual_clip <= 1.0:
            out.append(f"algo.dual_clip={a.dual_clip}: must be > 1 (or null)")
        if a.kl_target is not None and a.beta <= 0:
            out.append(
                "algo.kl_target is set but algo.beta=0: adaptive KL needs a starting beta > 0"
            )
        if a.objective == "maxent_listwise":
            m = a.maxent
            k = a.group_size
            if a.loss_agg not in ("auto", "seq_mean_token_sum_norm"):
                out.append(
                    "algo.objective=maxent_listwise requires the Dr.GRPO critic setting "
                    f"(algo.loss_agg auto or seq_mean_token_sum_norm), got {a.loss_agg!r}"
                )
            if a.micro_batch_size % max(k, 1):
                out.append(
                    f"algo.micro_batch_size={a.micro_batch_size} must be divisible by algo.group_size={k} "
                    "for maxent_listwise (each micro-batch holds whole prompt groups)"
                )
            if m.tau <= 0:
                out.append(f"algo.maxent.tau={m.tau}: must be > 0")
            if a.micro_batch_tokens is not None:
                out.append(
                    "algo.micro_batch_tokens is not used by maxent_listwise (its micro-batches hold "
                    "whole prompt groups of algo.micro_batch_size sequences); leave it unset"
                )
            if m.q_temperature <= 0:
                out.append(f"algo.maxent.q_temperature={m.q_temperature}: must be > 0")
            if k > 1 and not (0 < m.q_eps < 1.0 / k):
                out.append(f"algo.maxent.q_eps={m.q_eps}: must be in (0, 1/K) = (0, {1.0 / k:.4g})")
        if a.objective == "psgrpo_steps" and not a.psgrpo.prm:
            out.append(
                "algo.objective=psgrpo_steps needs algo.psgrpo.prm (a PRM model folder or 'pkg.mod:fn')"
            )
        if self.rollout.engine == "hf" and self.rollout.sleep_during_update:
            out.append("rollout.sleep_during_update needs rollout.engine=vllm")
        if self.data.task == "file" and not self.data.train_path:
            out.append("data.task=file needs data.train_path")
        for p in (self.data.train_path, self.data.eval_path):
            if p and not Path(p).exists():
                out.append(f"data file {p} does not exist")
        for i, es in enumerate(self.eval.sets):
            if es.path and not Path(es.path).exists():
                out.append(f"eval.sets[{i}] ({es.name}): file {es.path} does not exist")
        if self.data.task not in ("arithmetic", "countdown", "file"):
            out.append(
                f"data.task={self.data.task!r} is unknown; known: arithmetic, countdown, file"
            )
        for i, spec in enumerate(self.reward.specs):
            try:
                validate_reward_spec(spec)
            except ValueError as exc:
                out.append(f"reward.specs[{i}]: {exc}")
        b1, b2 = self.train.adam_betas
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            out.append(
                f"train.adam_betas={list(self.train.adam_betas)}: each beta must be in [0, 1)"
            )
        if self.train.warmup_steps >= self.train.max_steps and self.train.schedule != "constant":
            out.append(
                f"train.warmup_steps={self.train.warmup_steps} >= train.max_steps={self.train.max_steps}: "
                "the run would end before reaching its peak learning rate"
            )
        return out

    def validate_against_model(self, context_length: int | None) -> list[str]:
        """Checks that need the model's config.json (read without loading weights)."""
        if context_length is None:
            return []
        need = self.data.max_prompt_tokens + self.rollout.max_new_tokens
        if need > context_length:
            return [
                f"data.max_prompt_tokens + rollout.max_new_tokens = {need} exceeds the model context "
                f"({context_length} tokens)"
            ]
        return []

    def validate(self) -> Config:
        probs = self.problems()
        if probs:
            raise ConfigError("invalid config:\n  - " + "\n  - ".join(probs))
        return self

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


# ---------------------------------------------------------------------- loading


def _known_keys(model_cls: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model_cls.model_fields.items():
        dotted = f"{prefix}{name}"
        keys.append(dotted)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys.extend(_known_keys(ann, dotted + "."))
    return keys


# Names users bring from TRL / OAT / OpenRLHF / verl, mapped to ours for the "did you mean" hint.
ALIASES = {
    "learning_rate": "train.lr",
    "lr_scheduler": "train.schedule",
    "lr_scheduler_type": "train.schedule",
    "num_samples": "algo.group_size",
    "num_generations": "algo.group_size",
    "n_samples_per_prompt": "algo.group_size",
    "kl_coef": "algo.beta",
    "init_kl_coef": "algo.beta",
    "kl_penalty_coef": "algo.beta",
    "generate_max_length": "rollout.max_new_tokens",
    "max_completion_length": "rollout.max_new_tokens",
    "max_tokens": "rollout.max_new_tokens",
    "generate_max_len": "rollout.max_new_tokens",
    "epsilon": "algo.clip_low",
    "epsilon_high": "algo.clip_high",
    "eps_clip": "algo.clip_low",
    "loss_type": "algo.objective",
    "adv_estimator": "algo.objective",
    "num_ppo_epochs": "algo.epochs_per_batch",
    "num_iterations": "algo.epochs_per_batch",
    "max_grad_norm": "train.max_grad_norm",
    "model": "model.name_or_path",
    "pretrain": "model.name_or_path",
    "prompt_template": "data.template",
    "max_steps": "train.max_steps",
    "seed": "train.seed",
    "warmup_steps": "train.warmup_steps",
    "beta": "algo.beta",
    "lora_rank": "model.lora.rank",
}


def _check_keys(data: dict, model_cls: type[BaseModel], prefix: str = "") -> None:
    """Raise ConfigError for the first unknown key, suggesting the closest valid dotted key."""
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in model_cls.model_fields:
            known = _known_keys(model_cls, prefix)
            close = [ALIASES[key]] if key in ALIASES else []
            close = close or difflib.get_close_matches(dotted, known, n=1, cutoff=0.5)
            if not close:  # try the key alone against every leaf name anywhere in the config
                all_keys = _known_keys(Config)
                leaf = {k.rsplit(".", 1)[-1]: k for k in all_keys}
                best = difflib.get_close_matches(key, list(leaf), n=1, cutoff=0.6)
                close = [leaf[best[0]]] if best else []
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown config key {dotted!r}{hint}")
        ann = model_cls.model_fields[key].annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel) and isinstance(value, dict):
            _check_keys(value, ann, dotted + ".")


def _parse_value(text: str) -> Any:
    """Parse an override's value as YAML (so 2e-6, true, [a, b] and null work)."""
    # YAML 1.1 reads "2e-6" as a string; numbers in exponent form are common in overrides.
    if re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", text):
        return float(text)
    # YAML 1.1 turns on/off/yes/no into booleans; keep them as words (pydantic still reads them
    # as booleans where a field is boolean, and `model.autocast=off` stays the word "off").
    if text.lower() in ("on", "off", "yes", "no", "y", "n"):
        return text
    return yaml.safe_load(text) if text != "" else ""


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``a.b.c=value`` overrides to a nested dict (in place) and return it."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        key, _, raw = item.partition("=")
        parts = key.strip().split(".")
        node = data
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
        node[parts[-1]] = _parse_value(raw.strip())
    return data


def _format_validation_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        lines.append(f"{loc}: {err['msg']} (got {err.get('input')!r})")
    return "invalid config value:\n  - " + "\n  - ".join(lines)


def config_from_dict(data: dict) -> Config:
    _check_keys(data, Config)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config (or the defaults when ``path`` is None) and apply dotted overrides."""
    data: dict = {}
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"config file {p} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {p} is not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(
                f"config file {p} must hold a mapping of sections, got {type(loaded).__name__}"
            )
        data = loaded or {}
    apply_overrides(data, overrides or [])
    return config_from_dict(data)
