"""The sections of the run config (model, data, rollout, algo, train, logging) and the root `Config`.

Pure data: importing this module loads pydantic and yaml only. The checks that relate knobs to
each other live in `rlvr.config.validate` (`Config.validate()` calls them); the checks that need
other packages (an objective's own rules, reward specs) in `rlvr.training.preflight.checks`.
"""

from __future__ import annotations

from typing import Any, Literal

import yaml
from pydantic import Field

from rlvr.config import validate
from rlvr.config.base import ConfigError, Section
from rlvr.config.eval import EvalConfig
from rlvr.config.health import HealthConfig
from rlvr.config.lora import LoraConfig
from rlvr.config.reward import RewardConfig

TEMPLATES = ("chat", "r1", "qwen_math", "none")


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
        "else SDPA (eager keeps a T x T score matrix per head for the backward). Eager on a text "
        "model runs without repeating the key/value heads (training/grouped_attention.py).",
    )
    gradient_checkpointing: bool = False
    lean_backward: bool = Field(
        True,
        description="Keep less for the backward with the same arithmetic: linears under "
        "autocast keep their float32 weight instead of a bf16 copy, RMSNorm keeps its input and "
        "1/rms, the gated MLP recomputes SiLU (training/lean_backward.py; ~0.4 GB less on the "
        "default model's update).",
    )
    freeze: list[str] | None = Field(
        None,
        description="Parameter name prefixes kept frozen. None: a VLM's vision tower "
        "(e.g. 'model.visual.'), nothing for a text model; []: train everything.",
    )
    lora: LoraConfig = Field(default_factory=LoraConfig)


class DataConfig(Section):
    task: str = Field(
        "arithmetic",
        description="Built-in task ('arithmetic', 'countdown', 'shapes': images, needs a "
        "vision-language model) or 'file' to read train_path/eval_path.",
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
    train_path: str | None = Field(
        None,
        description="A .jsonl/.json/.csv/.parquet file, a dataset folder (hub layout or "
        "save_to_disk) or a hub id 'hf:owner/name?config=C&split=S&revision=R' (rlvr.data.hub).",
    )
    eval_path: str | None = Field(None, description="Held-out rows; the same forms as train_path.")
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    answer_extract: Literal["none", "gsm8k", "boxed"] = Field(
        "none",
        description="Reference answer inside answer_field: none (as is), gsm8k (after '#### '), "
        "boxed (the last \\boxed{} of a solution).",
    )
    system_prompt: str | None = None
    template: Literal["chat", "r1", "qwen_math", "none"] = Field(
        "chat", description="How a problem becomes the text the model sees."
    )
    max_prompt_tokens: int = Field(256, gt=0, description="Prompts longer than this are an error.")
    seed: int = 0


class RolloutConfig(Section):
    engine: Literal["hf", "vllm", "auto"] = Field(
        "auto",
        description="'hf' (the trainer's own transformers module), 'vllm', or 'auto' (vllm when "
        "installed).",
    )
    hf_decoder: Literal["loop", "generate"] = Field(
        "loop",
        description="How the hf engine samples text prompts (rollouts and evaluation): 'loop' is "
        "rlvr's decoding loop "
        "(rollout/decode.py: inverse-CDF sampling, finished rows leave the batch; about 1.5x "
        "faster on the CPU); 'generate' is transformers' generate, the reference the loop is "
        "tested against (benchmarks/studies/sampler_ab.py compares how fast each learns). Image prompts "
        "always use generate.",
    )
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 disables top-k.")
    max_new_tokens: int = Field(48, gt=0)
    stop: list[str] = Field(
        default_factory=list, description="Stop strings (kept in the completion)."
    )
    batch_size: int = Field(
        64, gt=0, description="Sequences sampled together in one batch (hf engine)."
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
    max_staleness: int = Field(
        0,
        ge=0,
        le=1,
        description="1: the next step's batch is generated from the policy before this step's "
        "update (overlapped with it in rollout.mode=server); pair with algo.tis_cap. 0: on-policy.",
    )
    # rollout.mode=server: vLLM in its own process (rlvr.rollout.server); docs/rollout.md
    mode: Literal["colocated", "server"] = Field(
        "colocated",
        description="'colocated': the engine runs in the trainer's process; 'server': a vLLM "
        "OpenAI-compatible server in its own process (started by rlvr train unless server_url).",
    )
    server_url: str | None = Field(
        None,
        description="http://host:port of a running `rlvr rollout-server`; None: rlvr train starts one.",
    )
    server_port: int = Field(
        8411, ge=1, le=65535, description="Port of the server rlvr train starts."
    )
    server_python: str | None = Field(
        None,
        description="Python that runs the server rlvr train starts (needs vLLM); None: this one.",
    )
    sync_host: str = Field(
        "127.0.0.1", description="Address of this trainer that the server reaches for weight sync."
    )
    sync_port: int = Field(0, ge=0, le=65535, description="Weight-sync group port; 0: a free one.")
    server_timeout_s: float = Field(
        600.0, gt=0, description="Longest wait for the server to start, and for one weight sync."
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
    whiten_advantages: bool = Field(
        True,
        description="Whiten GAE advantages over the batch's valid tokens (verl always does, "
        "OpenRLHF by default).",
    )


class PSGRPOStepsConfig(Section):
    prm: str | None = Field(
        None,
        description="PRM for objectives psgrpo_steps and prm_dense: token-classification model folder or 'pkg.mod:fn'.",
    )
    step_pattern: str = Field(r"^Step \d+:", description="Regex (multiline) that starts a step.")
    answer_pattern: str = Field(r"^†Answer:", description="Regex of the final answer line.")
    tag_token: str = Field(
        "ки", description="Token the HF PRM scores after each step (URSA style)."
    )
    label_index: int = 0


class AlgoConfig(Section):
    objective: str = Field(
        "drgrpo", description="An objective of `rlvr.objectives.OBJECTIVES` (docs/objectives.md)."
    )
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
    logprob_chunk_tokens: int | None = Field(
        1024,
        ge=0,
        description="Completion tokens whose [tokens, vocab] logits exist at once: log-probs and "
        "entropies are read from the last hidden states this many tokens at a time, the backward "
        "recomputing each chunk (model/head_logprobs.py; docs/memory-plan.md). 0 or null: the "
        "full logits of every completion token at once (the path before this knob).",
    )
    share_prompt: bool = Field(
        True,
        description="Run a prompt once per micro-batch for all the samples that share it (the "
        "same logits and gradient up to rounding; fewer positions through the model, most with "
        "long prompts and short replies). The whole pass runs anyway under gradient "
        "checkpointing, FSDP2/DDP and for vision inputs (training/shared_prompt.py).",
    )
    clip_low: float = Field(0.2, ge=0.0)
    clip_high: float = Field(
        0.2, ge=0.0, description="Set above clip_low for clip-higher (e.g. 0.28)."
    )
    dual_clip: float | None = Field(None, description="Dual-clip constant c > 1, or None.")
    # = rlvr.algorithms.LOG_RATIO_CLAMP (config imports no torch; a test keeps the two equal)
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
    dynamic_sampling: bool = Field(
        False,
        description="DAPO dynamic sampling: draw fresh prompts until the step has "
        "prompts_per_step groups whose rewards are not all equal (arXiv 2503.14476).",
    )
    dynamic_sampling_max_rounds: int = Field(
        3, ge=1, description="Most generation rounds per step with dynamic_sampling."
    )
    tis_cap: float | None = Field(
        None,
        gt=0,
        description="Truncated importance sampling: weight each token's policy-gradient term by "
        "min(exp(trainer old log-prob - engine log-prob), tis_cap) to correct the engine/trainer "
        "mismatch; null = off. Costs one no-grad forward pass per batch.",
    )
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
    allocator: Literal["auto", "tcmalloc", "jemalloc", "system"] = Field(
        "auto",
        description="malloc of `rlvr train`/`rlvr eval` (started again with it in LD_PRELOAD): "
        "auto takes tcmalloc, else jemalloc, where the system has one (faster steps and a lower "
        "peak than glibc's on the CPU), else the system's; see rlvr.allocator.",
    )
    onednn_cache: int = Field(
        256,
        ge=0,
        description="oneDNN primitives the process keeps compiled (ONEDNN_PRIMITIVE_CACHE_CAPACITY, "
        "set before the model loads unless already set; 0: oneDNN's 1024). Fewer hold less "
        "memory at an equal step time on the CPU; see rlvr.onednn_cache.",
    )
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
    def rollout_batch_sequences(self) -> int:
        return self.algo.prompts_per_step * self.algo.group_size

    def run_name(self) -> str:
        import time

        return self.train.run_name or (
            f"{self.algo.objective}-{self.data.task}-{time.strftime('%Y%m%d-%H%M%S')}"
        )

    # ------------------------------------------------------------------ guardrails
    def problems(self) -> list[str]:
        """The contradictions among this config's own knobs, each naming the knob and the rule
        it breaks (a run checks more: `rlvr.training.preflight.checks.config_problems`)."""
        return validate.problems(self)

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
        """This config, or ConfigError listing ``problems()``."""
        probs = self.problems()
        if probs:
            raise ConfigError("invalid config:\n  - " + "\n  - ".join(probs))
        return self

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)
