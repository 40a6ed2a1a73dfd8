"""Everything a run needs before its first step, built once: the `Run` holder of its parts (data,
model, reference, engine, rewards, objective, run dir) and the `TrainState` (weights, optimizer,
scheduler, sampler, KL controller, counters)."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlvr import onednn_cache, sandbox
from rlvr.algorithms import AdaptiveKLController, FixedKLController
from rlvr.checkpoint.resume_plan import plan_resume
from rlvr.config import Config, ConfigError
from rlvr.data.rows import load_rows_for, reward_specs
from rlvr.distributed import (
    DistInfo,
    barrier,
    broadcast_object,
    device_for,
    init_distributed,
    wrap_model,
    wrap_module,
)
from rlvr.jsonio import atomic_write_text
from rlvr.model import lean_backward
from rlvr.model.attention import use_training_attention
from rlvr.model.forward import SequenceBatch, policy_outputs
from rlvr.model.freeze import default_freeze, freeze_prefixes, parameter_counts
from rlvr.model.loading import model_context_length, prepare_tokenizer, resolve_model_path
from rlvr.model.lora import apply_lora
from rlvr.model.precision import resolve_autocast
from rlvr.model.vlm import load_policy_model, load_policy_tokenizer
from rlvr.objectives import Objective, build_objective
from rlvr.rewards.runner import RewardRunner
from rlvr.rollout.builder import build_engine
from rlvr.rollout.episodes import EpisodeRunner
from rlvr.training.batching import PromptSampler
from rlvr.training.preflight.checks import check_config, distributed_problems, run_dir_taken
from rlvr.training.preflight.memory_check import memory_preflight
from rlvr.training.preflight.memory_plan import MemoryPlan
from rlvr.training.preflight.prompts import check_prompt_lengths
from rlvr.training.schedule import build_scheduler, run_preflight
from rlvr.training.state import TrainState


@dataclass
class Run:
    """A run's parts, built once by `setup_run` and read (never copied) by the step, the update,
    the loop and the evaluator. What changes as the run trains (weights, optimizer, counters) is
    the `TrainState`; what is fixed for the run's life is here."""

    cfg: Config
    run_dir: Path
    device: torch.device
    autocast: bool  # bf16 autocast in the forward passes (model.autocast)
    model: torch.nn.Module  # the plain module: generate, save, adapters
    tokenizer: object
    engine: object  # the rollout engine (rlvr.rollout.builder)
    rewards: RewardRunner
    train_rows: list[dict]
    eval_rows: list[dict]
    objective: Objective
    dist: DistInfo = field(default_factory=DistInfo)
    # The module the update's forward goes through: a DDP wrapper, the FSDP2-sharded model, or
    # `model` itself in one process.
    train_model: torch.nn.Module | None = None
    # The frozen reference: a copy of the initial model, or None with LoRA (the base model with
    # its adapters disabled) or when the objective needs no reference.
    ref_model: torch.nn.Module | None = None
    resume_from: Path | None = None  # checkpoint folder the loop restores before step 1
    processor: object | None = None  # a vision-language model's processor (renders image rows)
    episodes: EpisodeRunner | None = None  # env.name: multi-turn episodes (rlvr.rollout.episodes)
    # params_trainable / params_total (elements) after model.freeze and LoRA; in every step's metrics
    param_counts: dict[str, int] = field(default_factory=dict)
    # the memory plan checked before the weights loaded (None: a model passed in, or no shape)
    memory_plan: MemoryPlan | None = None

    @property
    def processing(self):
        """What saves beside the weights: the processor of a VLM (tokenizer included), else the
        tokenizer."""
        return self.processor if self.processor is not None else self.tokenizer

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id

    @property
    def image_token_id(self) -> int | None:
        """A vision-language model's image token (its prompts carry images); None for text."""
        return getattr(self.processor, "image_token_id", None)

    @property
    def temperature(self) -> float:
        """The sampling temperature log-probs are taken at (greedy sampling: 1)."""
        t = self.cfg.rollout.temperature
        return t if t > 0 else 1.0

    def autocast_context(self) -> contextlib.AbstractContextManager:
        """bf16 autocast around a forward pass where the run uses it, else nothing."""
        if not self.autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Weights to push into the rollout engine (LoRA merged on the fly by the engine sync)."""
        yield from self.model.state_dict().items()

    def reference_logprobs(self, sb: SequenceBatch, temperature: float) -> torch.Tensor:
        """``[B, Tc]`` log-probs of the frozen reference: the initial model's copy, or with LoRA
        the base model with its adapters disabled."""
        chunk = self.cfg.algo.logprob_chunk_tokens
        with self.autocast_context():
            if self.ref_model is not None:
                out, _ = policy_outputs(self.ref_model, sb, chunk_tokens=chunk)
                return out.logprobs(sb, temperature, entropy=False)[0]
            with self.model.disable_adapter():  # the head read inside: adapters off there too
                out, _ = policy_outputs(self.model, sb, chunk_tokens=chunk)
                return out.logprobs(sb, temperature, entropy=False)[0]

    def close(self) -> None:
        """Stop what the run started outside this process's memory: engine, reward workers."""
        self.engine.close()
        self.rewards.close()


def preflight(cfg: Config) -> None:
    """The learning-rate pre-flight; raises ConfigError when the LR at the check step is too low."""
    t = cfg.train
    if t.preflight_step <= 0 or t.preflight_step > t.max_steps:
        return
    res = run_preflight(t)
    if not res.ok:
        raise ConfigError(f"learning-rate pre-flight failed: {res.message}")


def make_run_dir(cfg: Config, run_dir: Path | None, *, reuse: bool = False) -> Path:
    """Create the run directory and write its ``config.yaml``.

    A directory that already holds a run is refused unless ``reuse`` (a resume) is set.
    """
    if run_dir is None:
        run_dir = Path(cfg.train.output_dir) / cfg.run_name()
    run_dir = Path(run_dir)
    if not reuse and (taken := run_dir_taken(run_dir)) is not None:
        raise ConfigError(taken)
    run_dir.mkdir(parents=True, exist_ok=True)
    # atomic: a full disk must never leave a torn config.yaml that a resume would read
    atomic_write_text(run_dir / "config.yaml", cfg.to_yaml())
    return run_dir


def _check_prompts(cfg: Config, tokenizer, processor, train_rows, eval_rows) -> int:
    """The longest train or eval prompt in tokens, as the run will send it; ConfigError on one
    over data.max_prompt_tokens (`preflight.prompts.check_prompt_lengths`)."""
    return max(
        check_prompt_lengths(cfg, tokenizer, train_rows, "train", processor),
        check_prompt_lengths(cfg, tokenizer, eval_rows, "eval", processor),
    )


def setup_run(
    cfg: Config, *, model=None, tokenizer=None, processor=None, run_dir: Path | None = None
) -> tuple[Run, TrainState]:
    """Check, load and build everything; fails before any model loads on a bad config.

    ``model``/``tokenizer`` (and ``processor`` for a VLM): an already-loaded policy."""
    check_config(cfg)
    preflight(cfg)
    info = init_distributed()
    probs = distributed_problems(cfg, info)
    if probs:
        raise ConfigError("invalid config for a multi-process run:\n  - " + "\n  - ".join(probs))
    if info.enabled and run_dir is None and not cfg.train.resume:
        # every rank must use rank 0's run name (it carries a time stamp)
        cfg.train.run_name = broadcast_object(cfg.run_name(), info)
    plan = plan_resume(cfg, run_dir)
    if plan is not None:
        run_dir = plan.run_dir
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    train_rows, eval_rows = load_rows_for(cfg)
    memory_plan = None  # a model passed in is not planned: its config may not be cfg's
    prompts_checked = model is None
    if model is None:
        path = resolve_model_path(cfg.model.name_or_path)
        problems = cfg.validate_against_model(model_context_length(path))
        # the prompts are counted before any weights load: the plan sizes its rows by them
        longest = _check_prompts(cfg, *load_policy_tokenizer(path), train_rows, eval_rows)
        mem_problems, memory_plan = memory_preflight(
            cfg, world_size=info.world_size, echo=info.is_main, prompt_tokens=longest
        )
        problems += mem_problems
        if problems:
            raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))
    sandbox.configure(cfg.sandbox)  # the backend and limits of model-written code (rlvr.sandbox)
    rewards = RewardRunner(
        reward_specs(cfg),
        timeout_s=cfg.reward.timeout_s,
        max_failure_fraction=cfg.reward.max_failure_fraction,
    )
    onednn_cache.bound(cfg.train.onednn_cache)  # before the first bf16 matmul compiles one
    device = device_for(info, cfg.model.device)
    dtype = torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float32
    if model is None:
        model, tokenizer, processor = load_policy_model(
            cfg.model.name_or_path, dtype=dtype, device=str(device)
        )
    else:
        model = model.to(device)
        prepare_tokenizer(tokenizer)
    use_training_attention(model, cfg, str(device))
    if cfg.model.lean_backward:
        lean_backward.install(model)  # before LoRA and DDP/FSDP2 wrap the layers
    freeze = default_freeze(model) if cfg.model.freeze is None else cfg.model.freeze
    counts = freeze_prefixes(model, freeze)  # a prefix that matches nothing is an error
    if freeze and info.is_main:
        print(f"[rlvr] frozen {freeze}: {counts}", flush=True)
    autocast = resolve_autocast(cfg, device)
    if not prompts_checked:  # a model passed in: its tokenizer counts the prompts
        _check_prompts(cfg, tokenizer, processor, train_rows, eval_rows)
    if cfg.model.gradient_checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5
        (enable or model.gradient_checkpointing_enable)()
    # New weights (LoRA's A matrices, an objective's modules) are drawn from train.seed alone:
    # torch's default generator starts from a random seed in every process, so without this two
    # invocations, and under FSDP2 the shards each rank keeps, would start from different draws.
    torch.manual_seed(cfg.train.seed)
    if cfg.model.lora.enabled:
        model = apply_lora(model, cfg.model.lora, exclude=freeze)  # frozen parts get no adapter
    param_counts = parameter_counts(model)  # after the freeze and LoRA's own freezing
    objective = build_objective(cfg, tokenizer)
    ref_model = None
    if objective.needs().reference and not cfg.model.lora.enabled:
        # LoRA: the reference is the base model with the adapters disabled
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    train_model = wrap_model(model, info, cfg.train.parallel)  # before the optimizer sees params
    params = [p for p in model.parameters() if p.requires_grad]
    extra = objective.attach(model, device, wrap=lambda m: wrap_module(m, info, cfg.train.parallel))
    groups = [{"params": params, "lr": cfg.train.lr}, *extra]
    optimizer = torch.optim.AdamW(
        groups,
        lr=cfg.train.lr,
        betas=tuple(cfg.train.adam_betas),
        weight_decay=cfg.train.weight_decay,
        eps=1e-8,
        # The fused kernel updates each tensor in one pass, with no full-size temporaries
        # (foreach's peak is one extra copy of the weights).
        fused=True,
    )
    scheduler = build_scheduler(
        optimizer,
        kind=cfg.train.schedule,
        warmup_steps=cfg.train.warmup_steps,
        total_steps=cfg.train.max_steps,
        min_lr_ratio=cfg.train.min_lr_ratio,
    )
    engine = build_engine(
        cfg, model, tokenizer, autocast, synced=info.enabled and cfg.train.parallel == "fsdp2"
    )
    if info.is_main:
        out_dir = make_run_dir(cfg, run_dir, reuse=plan is not None)
    else:
        # Other ranks write their copies of run files to a scratch folder; rank 0's are the record.
        main_dir = (
            Path(run_dir) if run_dir is not None else Path(cfg.train.output_dir) / cfg.run_name()
        )
        out_dir = main_dir / "ranks" / f"rank{info.rank}"
        out_dir.mkdir(parents=True, exist_ok=True)
    barrier(info)
    run = Run(
        cfg=cfg,
        run_dir=out_dir,
        device=device,
        autocast=autocast,
        model=model,
        tokenizer=tokenizer,
        engine=engine,
        rewards=rewards,
        train_rows=train_rows,
        eval_rows=eval_rows,
        objective=objective,
        resume_from=plan.checkpoint if plan is not None else None,
        dist=info,
        train_model=train_model,
        ref_model=ref_model,
        processor=processor,
        param_counts=param_counts,
        episodes=EpisodeRunner.from_config(cfg, tokenizer),
        memory_plan=memory_plan,
    )
    a = cfg.algo
    state = TrainState(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        sampler=PromptSampler(len(train_rows), a.prompts_per_step, seed=cfg.train.seed),
        kl_ctl=AdaptiveKLController(a.beta, a.kl_target, a.kl_horizon)
        if a.kl_target is not None
        else FixedKLController(a.beta),
        objective=objective,
    )
    return run, state
