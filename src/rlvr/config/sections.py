"""The sections of the run config (model, data, rollout, algo, train, logging) and the root `Config`.

Pure data: importing this module loads pydantic and yaml only. The checks that relate knobs to
each other live in `rlvr.config.validate` (``problems(cfg)``, ``check(cfg)``), which reads these
sections and is not imported here; the checks that need other packages (an objective's own rules,
reward specs) in `rlvr.training.preflight.checks`.
"""

from __future__ import annotations

from typing import Any, Literal

import yaml
from pydantic import Field, PrivateAttr, model_validator

from rlvr.config.algo import AlgoConfig
from rlvr.config.base import Section
from rlvr.config.env import EnvConfig, with_task_defaults
from rlvr.config.eval import EvalConfig
from rlvr.config.health import HealthConfig
from rlvr.config.inferred import infer
from rlvr.config.lora import LoraConfig
from rlvr.config.reward import RewardConfig
from rlvr.config.sandbox import SandboxConfig

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
        "else SDPA (eager keeps a T x T score matrix per head for the backward). On a text model "
        "eager runs without repeating the key/value heads and both take the packed update "
        "(model/attention.py, model/packed_rows.py).",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute activations in the backward (less memory, ~30% slower update).",
    )
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
        "vision-language model; 'calc_tool': multi-digit products for the calculator tool, "
        "turns on env.name=calculator unless env.name is given; 'code_fn': short Python "
        "functions graded by the code reward in the sandbox), a reasoning-gym task "
        "'reasoning_gym:<name>' (the extra rlvr[reasoning-gym]) or 'file' to read "
        "train_path/eval_path.",
    )
    task_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Options of the built-in task generator (e.g. ops, digits; a reasoning-gym "
        "task's config fields, e.g. min_terms).",
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
    prompt_field: str = Field(
        "prompt", description="The row field holding the problem text (e.g. question)."
    )
    answer_field: str = Field(
        "answer", description="The row field holding the reference answer, given to rewards."
    )
    answer_extract: Literal["none", "gsm8k", "boxed"] = Field(
        "none",
        description="Reference answer inside answer_field: none (as is), gsm8k (after '#### '), "
        "boxed (the last \\boxed{} of a solution).",
    )
    system_prompt: str | None = Field(
        None, description="A system message put before every prompt (chat templates)."
    )
    template: Literal["chat", "r1", "qwen_math", "none"] = Field(
        "chat", description="How a problem becomes the text the model sees."
    )
    max_prompt_tokens: int = Field(256, gt=0, description="Prompts longer than this are an error.")
    seed: int = Field(0, description="Seed of a built-in task's rows.")


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
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature of rollouts.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling of rollouts.")
    top_k: int = Field(0, ge=0, description="0 disables top-k.")
    max_new_tokens: int = Field(
        48,
        gt=0,
        description="Most tokens of one reply; longer replies are cut (truncation_rate). "
        "Evaluations use it too unless eval.max_new_tokens is set.",
    )
    stop: list[str] = Field(
        default_factory=list, description="Stop strings (kept in the completion)."
    )
    batch_size: int = Field(
        64, gt=0, description="Sequences sampled together in one batch (hf engine)."
    )
    # vLLM knobs (ignored by the hf engine)
    gpu_memory_utilization: float = Field(
        0.3, gt=0.0, le=1.0, description="vLLM: share of the GPU memory its engine may take."
    )
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM: GPUs per engine.")
    enforce_eager: bool = Field(True, description="vLLM: no CUDA graphs (faster start).")
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
        le=4,
        description="k: the batches of the next k steps are requested before this step's update "
        "(generated alongside the trainer in rollout.mode=server, in order in the trainer's "
        "thread otherwise), each at most k versions old when trained; an older batch is dropped "
        "and regenerated (docs/rollout.md). k > 0 needs a behaviour correction: token truncation "
        "(cap 2) where algo.rollout_correction.level and algo.tis_cap are unset; refused with "
        "the correction off or an objective that takes none. 0: on-policy.",
    )
    partial: bool = Field(
        False,
        description="Partial rollouts (rollout.mode=server, max_staleness >= 1): a weight push "
        "does not wait for the generation in flight; the worker pauses its requests, takes the "
        "new weights and continues them, each token labelled with the version that sampled it "
        "(docs/rollout.md).",
    )
    lora_sync: Literal["auto", "adapter", "merged"] = Field(
        "auto",
        description="With model.lora.enabled and vLLM: 'adapter' sends only the LoRA tensors (the "
        "engine serves the base model and loads the adapter), 'merged' sends the full weights "
        "with the adapter merged; 'auto': adapter where vLLM can serve the adapter, else merged.",
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
    # multi-turn episodes (env.name set; docs/environments.md)
    max_turns: int = Field(4, ge=1, description="Most model turns of one episode (env.name set).")
    max_episode_tokens: int = Field(
        256,
        gt=0,
        description="Most tokens after the prompt in one episode, model and environment turns "
        "together (env.name set); each model turn also stops at rollout.max_new_tokens.",
    )


class TrainConfig(Section):
    lr: float = Field(
        2e-5,
        gt=0,
        description="Peak learning rate (AdamW). With model.lora.enabled and no lr given: "
        "10x this default, 2e-4 (rlvr.config.inferred).",
    )
    schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="Learning-rate schedule after the warmup."
    )
    warmup_steps: int = Field(0, ge=0, description="Steps of linear warmup to train.lr.")
    min_lr_ratio: float = Field(
        0.1, ge=0.0, le=1.0, description="cosine/linear: the last step's lr as a share of lr."
    )
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    adam_betas: tuple[float, float] = Field(
        (0.9, 0.999), description="AdamW betas, each in [0, 1)."
    )
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping by global norm.")
    max_steps: int = Field(20, gt=0, description="Training steps (rollout batches).")
    seed: int = Field(0, description="Seed of sampling, prompt order and initialisation.")
    output_dir: str = Field("runs", description="Run directories go under this folder.")
    run_name: str | None = Field(None, description="Default: <objective>-<task>-<time>.")
    save_every: int = Field(
        0, ge=0, description="Checkpoint every N steps (0: only the final model)."
    )
    max_checkpoints: int = Field(
        2, ge=1, description="Checkpoints kept (the best eval's is kept besides)."
    )
    resume: str | None = Field(
        None,
        description="'auto' (newest complete checkpoint of run_name, if any) or a run directory.",
    )
    stop_signals: list[Literal["SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP"]] = Field(
        ["SIGTERM", "SIGUSR1"],
        description="Signals that stop a run like Ctrl-C plus a checkpoint of the last finished "
        "step, status 'preempted', exit code 4 (a cluster's preemption; [] keeps their defaults).",
    )
    stop_grace_s: float = Field(
        20.0,
        ge=0,
        description="An update under way when a stop signal comes may finish in this (0: none); "
        "below the 30 s Slurm and Kubernetes give by default before SIGKILL, less the save.",
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
        5,
        ge=0,
        description="Write sampled completions every N steps, and at the first and last step "
        "(0: never).",
    )
    spike_threshold: float = Field(
        50.0, gt=0, description="grad_norm above this records the step's prompts in spikes.jsonl."
    )
    tensorboard: bool = Field(False, description="Also log to TensorBoard (rlvr[tensorboard]).")
    wandb: bool = Field(False, description="Also log to Weights & Biases (rlvr[wandb]).")
    wandb_project: str | None = Field(None, description="The W&B project (default: rlvr).")
    progress: bool = Field(True, description="Draw the progress bar.")


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
    env: EnvConfig = Field(default_factory=EnvConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    _inferred: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _task_defaults(cls, data: Any) -> Any:
        """A built-in task's episode settings (data.task=calc_tool: the calculator), unless the
        config gives env.name (rlvr.config.env.TASK_DEFAULTS)."""
        return with_task_defaults(data)

    @model_validator(mode="wrap")
    @classmethod
    def _inferred_settings(cls, data: Any, handler: Any) -> Any:
        """Settings that follow from other knobs the config gives (rlvr.config.inferred)."""
        data, notes = infer(data)
        cfg = handler(data)
        if notes and isinstance(cfg, Config):
            cfg._inferred = notes
        return cfg

    def inferred(self) -> dict[str, str]:
        """What this config's loading inferred: dotted key -> the sentence that announces it
        (a run prints them on its first lines)."""
        return dict(self._inferred)

    # ------------------------------------------------------------------ derived values
    @property
    def episodes(self) -> bool:
        """Whether rollouts are multi-turn episodes (``env.name`` set): the one place every
        consumer asks."""
        return bool(self.env.name)

    def completion_tokens(self) -> int:
        """Most tokens after the prompt in one sequence: a reply (rollout.max_new_tokens) or,
        with env.name set, a whole episode (rollout.max_episode_tokens)."""
        if self.episodes:
            return self.rollout.max_episode_tokens
        return self.rollout.max_new_tokens

    def rollout_batch_sequences(self) -> int:
        return self.algo.prompts_per_step * self.algo.group_size

    def run_name(self) -> str:
        import time

        return self.train.run_name or (
            f"{self.algo.objective}-{self.data.task}-{time.strftime('%Y%m%d-%H%M%S')}"
        )

    # ------------------------------------------------------------------ guardrails
    def validate_against_model(self, context_length: int | None) -> list[str]:
        """Checks that need the model's config.json (read without loading weights)."""
        if context_length is None:
            return []
        need = self.data.max_prompt_tokens + self.completion_tokens()
        if need > context_length:
            knob = "rollout.max_episode_tokens" if self.episodes else "rollout.max_new_tokens"
            return [
                f"data.max_prompt_tokens + {knob} = {need} exceeds the model context "
                f"({context_length} tokens)"
            ]
        return []

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)
