"""Other frameworks' names for rlvr's knobs, and the "did you mean" of an unknown key.

A user coming from TRL (``GRPOConfig``), verl (``ppo_trainer.yaml``) or OpenRLHF (its command
line) types the names they know. Each name below is mapped to the rlvr key with the same meaning
(with a note where the meaning differs in a way that matters), or to None with what rlvr does
instead: a name whose only resemblance to an rlvr key is its spelling is never suggested.

Lookup (`peer_entry`) takes the longest match first: ``actor_rollout_ref.rollout.n`` and
``data.train_batch_size`` (verl's dotted names) before a bare ``train_batch_size``
(OpenRLHF's, which counts samples, not prompts). A key that is no peer's name gets a lexical
suggestion only when it is a near-miss of a real key: at most one edit in five characters (a
typo), never a key that merely shares words.
"""

from __future__ import annotations

from collections.abc import Iterable

# name -> (rlvr key or None, note). The note says how the meaning differs, or, for None, what
# rlvr does instead. Names are matched on their last dotted parts (`peer_entry`).
PEER_NAMES: dict[str, tuple[str | None, str]] = {
    # ---- TRL (GRPOConfig / TrainingArguments)
    "learning_rate": ("train.lr", ""),
    "lr_scheduler": ("train.schedule", ""),
    "lr_scheduler_type": ("train.schedule", "constant, cosine or linear"),
    "warmup_ratio": (
        "train.warmup_steps",
        "rlvr counts warmup in steps, not as a fraction of the run",
    ),
    "num_train_epochs": (
        None,
        "rlvr counts steps: set train.max_steps (epochs = max_steps x algo.prompts_per_step / "
        "train rows; `rlvr train --dry-run` prints them)",
    ),
    "num_generations": ("algo.group_size", ""),
    "num_samples": ("algo.group_size", ""),
    "per_device_train_batch_size": (
        "algo.micro_batch_size",
        "TRL's completions per device per forward/backward pass; rlvr accumulates the gradient "
        "over micro-batches by itself",
    ),
    "gradient_accumulation_steps": (
        None,
        "gradient accumulation is automatic: each optimizer step takes its minibatch "
        "(algo.prompts_per_step x algo.group_size sequences / algo.minibatches) in "
        "micro-batches of algo.micro_batch_size sequences (or algo.micro_batch_tokens)",
    ),
    "generation_batch_size": (
        "algo.prompts_per_step",
        "TRL counts completions, rlvr prompts: algo.prompts_per_step = generation_batch_size / "
        "num_generations",
    ),
    "steps_per_generation": (
        "algo.minibatches",
        "TRL counts micro-batches per generation batch, rlvr optimizer steps: algo.minibatches "
        "= steps_per_generation / gradient_accumulation_steps (TRL's default: 1)",
    ),
    "max_completion_length": ("rollout.max_new_tokens", ""),
    "max_prompt_length": (
        "data.max_prompt_tokens",
        "a longer prompt is an error in rlvr, never cut",
    ),
    "num_iterations": ("algo.epochs_per_batch", ""),
    "epsilon": (
        "algo.clip_low",
        "and algo.clip_high: TRL's epsilon bounds both sides unless epsilon_high is set",
    ),
    "epsilon_high": ("algo.clip_high", ""),
    "beta": ("algo.beta", ""),
    "loss_type": (
        "algo.loss_agg",
        "TRL's loss_type is the loss's aggregation: grpo -> seq_mean_token_mean, dr_grpo -> "
        "seq_mean_token_sum_norm, bnpo or dapo -> token_mean; the advantages' std scaling is "
        "algo.objective (grpo scales, drgrpo does not)",
    ),
    "scale_rewards": (
        "algo.objective",
        "scaled by the group's std: algo.objective=grpo; unscaled: drgrpo (the default)",
    ),
    "importance_sampling_level": (
        "algo.objective",
        "sequence-level ratios: algo.objective=gspo",
    ),
    "mask_truncated_completions": (
        "reward.overlong_buffer",
        "rlvr does not drop cut replies; DAPO's overlong penalty shapes them instead",
    ),
    "vllm_importance_sampling_correction": (
        "algo.rollout_correction.level",
        "on: a level (token or sequence); off: level=off. With vLLM rlvr defaults to token "
        "truncation, cap 2",
    ),
    "vllm_importance_sampling_mode": (
        "algo.rollout_correction.level",
        "and .action: token_truncate is level=token action=truncate; TRL's default "
        "sequence_mask is level=sequence action=mask low=0 (one-sided)",
    ),
    "vllm_importance_sampling_clip_max": (
        "algo.rollout_correction.cap",
        "TRL's default is 3, rlvr's 2",
    ),
    "vllm_importance_sampling_cap": ("algo.rollout_correction.cap", "TRL's default is 3, rlvr's 2"),
    "vllm_importance_sampling_clip_min": (
        "algo.rollout_correction.low",
        "the mask's lower bound (TRL's unset is low=0); rlvr's truncation clamps from above only",
    ),
    "reward_weights": ("reward.specs", "each spec's weight: [{name: ..., weight: 0.5}]"),
    "reward_funcs": ("reward.specs", "[{name: 'my_module:my_function'}]"),
    "use_vllm": ("rollout.engine", "rollout.engine=vllm"),
    "vllm_mode": ("rollout.mode", "colocate -> colocated, server -> server"),
    "vllm_gpu_memory_utilization": ("rollout.gpu_memory_utilization", ""),
    # ---- asynchrony: verl's fully async recipe (async_training.*), AReaL
    "partial_rollout": (
        "rollout.partial",
        "a weight push pauses the generations in flight and continues them on the new weights; "
        "rlvr's needs rollout.mode=server and rollout.max_staleness >= 1",
    ),
    "staleness_threshold": (
        "rollout.max_staleness",
        "verl's is a share of stale samples per step; rlvr's the versions a batch may lag (0-4)",
    ),
    "max_head_offpolicyness": (
        "rollout.max_staleness",
        "AReaL's eta: versions a sample may lag; a batch beyond it is regenerated",
    ),
    "vllm_tensor_parallel_size": ("rollout.tensor_parallel_size", ""),
    "temperature": ("rollout.temperature", ""),
    "top_p": ("rollout.top_p", ""),
    "top_k": ("rollout.top_k", ""),
    "max_steps": ("train.max_steps", ""),
    "max_grad_norm": ("train.max_grad_norm", ""),
    "weight_decay": ("train.weight_decay", ""),
    "seed": ("train.seed", ""),
    "output_dir": ("train.output_dir", ""),
    "run_name": ("train.run_name", ""),
    "save_steps": ("train.save_every", ""),
    "save_total_limit": ("train.max_checkpoints", ""),
    "logging_steps": (None, "every step is logged to RUN_DIR/metrics.jsonl"),
    "eval_steps": ("eval.every", ""),
    "per_device_eval_batch_size": ("eval.batch_size", "prompts per generate() call"),
    "log_completions": (
        None,
        "completions are written to RUN_DIR/samples/ every logging.samples_every steps (and at "
        "the first and the last)",
    ),
    "sync_ref_model": (
        None,
        "the reference is the initial model (the LoRA base with LoRA) for the whole run",
    ),
    "ref_model_sync_steps": (
        None,
        "the reference is the initial model (the LoRA base with LoRA) for the whole run",
    ),
    "repetition_penalty": (
        None,
        "rollouts sample with temperature, top_p and top_k only (rollout.*), so the "
        "log-probs the loss uses are the sampler's",
    ),
    "min_p": (
        None,
        "rollouts sample with temperature, top_p and top_k only (rollout.*), so the "
        "log-probs the loss uses are the sampler's",
    ),
    "report_to": ("logging.wandb", "logging.wandb=true or logging.tensorboard=true"),
    "gradient_checkpointing": ("model.gradient_checkpointing", ""),
    "bf16": ("model.autocast", "model.autocast=bf16 (auto: where the device has it)"),
    "torch_dtype": ("model.dtype", ""),
    "model_name_or_path": ("model.name_or_path", ""),
    "dataset_name": ("data.train_path", "a hub dataset as 'hf:owner/name?split=train'"),
    "use_peft": ("model.lora.enabled", ""),
    "lora_r": ("model.lora.rank", ""),
    "lora_rank": ("model.lora.rank", ""),
    "lora_alpha": ("model.lora.alpha", ""),
    "lora_dropout": ("model.lora.dropout", ""),
    "lora_target_modules": ("model.lora.target_modules", ""),
    # ---- peft (LoraConfig)
    "lora.r": ("model.lora.rank", "peft's LoraConfig.r"),
    "r": ("model.lora.rank", "peft's LoraConfig.r"),
    "target_modules": ("model.lora.target_modules", ""),
    # ---- verl (ppo_trainer.yaml), dotted as its overrides are
    "data.train_batch_size": (
        "algo.prompts_per_step",
        "verl's data.train_batch_size counts prompts per step, as rlvr's does",
    ),
    "data.max_prompt_length": ("data.max_prompt_tokens", "a longer prompt is an error in rlvr"),
    "data.max_response_length": ("rollout.max_new_tokens", ""),
    "max_response_length": ("rollout.max_new_tokens", ""),
    "response_length": ("rollout.max_new_tokens", ""),
    "train_files": ("data.train_path", ""),
    "val_files": ("data.eval_path", ""),
    "prompt_key": ("data.prompt_field", ""),
    "rollout_is": (
        "algo.rollout_correction.level",
        "token or sequence, with action=truncate (verl's truncated IS weights)",
    ),
    "rollout_is_threshold": ("algo.rollout_correction.cap", ""),
    "rollout_rs": (
        "algo.rollout_correction.action",
        "reject (verl's rejection alone) or mask (with rollout_is: IS weights times the "
        "rejection); a rejected token stays in rlvr's token-mean denominator, verl drops it",
    ),
    "rollout_rs_threshold": ("algo.rollout_correction.cap", "the mask's upper bound"),
    "rollout_rs_threshold_lower": ("algo.rollout_correction.low", ""),
    "rollout.n": ("algo.group_size", "verl's rollout.n: responses per prompt"),
    "rollout_n": ("algo.group_size", "verl's rollout.n: responses per prompt"),
    "ppo_mini_batch_size": (
        "algo.minibatches",
        "verl counts prompts per optimizer step; rlvr counts optimizer steps per batch: "
        "algo.minibatches = data.train_batch_size / ppo_mini_batch_size",
    ),
    "ppo_micro_batch_size_per_gpu": ("algo.micro_batch_size", ""),
    "ppo_max_token_len_per_gpu": ("algo.micro_batch_tokens", ""),
    "ppo_epochs": ("algo.epochs_per_batch", ""),
    "clip_ratio": ("algo.clip_low", "and algo.clip_high for the upper side"),
    "clip_ratio_low": ("algo.clip_low", ""),
    "clip_ratio_high": ("algo.clip_high", ""),
    "clip_ratio_c": ("algo.dual_clip", ""),
    "use_kl_loss": ("algo.kl_mode", "algo.kl_mode=loss (the default) with algo.beta > 0"),
    "kl_loss_coef": ("algo.beta", "the KL as a loss term is rlvr's default, algo.kl_mode=loss"),
    "kl_loss_type": (
        "algo.kl_estimator",
        "verl's kl -> k1, mse -> k2, low_var_kl -> k3",
    ),
    "use_kl_in_reward": ("algo.kl_mode", "algo.kl_mode=reward"),
    "kl_ctrl.kl_coef": ("algo.beta", "with algo.kl_mode=reward (verl's use_kl_in_reward)"),
    "kl_ctrl.target_kl": ("algo.kl_target", ""),
    "kl_ctrl.horizon": ("algo.kl_horizon", ""),
    "adv_estimator": ("algo.objective", "grpo, rloo, gae -> ppo, ..."),
    "norm_adv_by_std_in_grpo": (
        "algo.objective",
        "true: grpo (std-scaled advantages), false: drgrpo (rlvr's default)",
    ),
    "custom_reward_function": (
        "reward.specs",
        "your reward as [{name: 'module:function'}], the module importable from the directory "
        "rlvr runs in; called as f(prompt, response, reference, **fields) (docs/config.md)",
    ),
    "custom_reward_function.path": (
        "reward.specs",
        "your reward as [{name: 'module:function'}], the module importable from the directory "
        "rlvr runs in; called as f(prompt, response, reference, **fields) (docs/config.md)",
    ),
    "custom_reward_function.name": (
        "reward.specs",
        "your reward as [{name: 'module:function'}], the module importable from the directory "
        "rlvr runs in; called as f(prompt, response, reference, **fields) (docs/config.md)",
    ),
    "use_dynamic_bsz": (
        "algo.micro_batch_tokens",
        "micro-batches by token count: set algo.micro_batch_tokens (verl's "
        "ppo_max_token_len_per_gpu)",
    ),
    "project_name": ("logging.wandb_project", "with logging.wandb=true"),
    "entropy_coeff": ("algo.entropy_coef", ""),
    "loss_agg_mode": (
        "algo.loss_agg",
        "token_mean, seq_mean_token_mean, seq_mean_token_sum_norm (underscores)",
    ),
    "grad_clip": ("train.max_grad_norm", ""),
    "optim.lr": ("train.lr", ""),
    "lr_warmup_steps": ("train.warmup_steps", ""),
    "lr_warmup_steps_ratio": (
        "train.warmup_steps",
        "rlvr counts warmup in steps, not as a fraction of the run",
    ),
    "warmup_style": ("train.schedule", "constant, cosine or linear"),
    "total_training_steps": ("train.max_steps", ""),
    "total_epochs": (
        None,
        "rlvr counts steps: set train.max_steps (`rlvr train --dry-run` prints the epochs)",
    ),
    "save_freq": ("train.save_every", ""),
    "test_freq": ("eval.every", ""),
    "val_before_train": ("eval.before_after", ""),
    "n_gpus_per_node": (None, "processes come from the command line: rlvr train --nproc N"),
    "nnodes": (None, "launch with torchrun across nodes (docs/distributed.md)"),
    "default_local_dir": ("train.output_dir", ""),
    "experiment_name": ("train.run_name", ""),
    "tensor_model_parallel_size": ("rollout.tensor_parallel_size", ""),
    "enable_gradient_checkpointing": ("model.gradient_checkpointing", ""),
    "model.path": ("model.name_or_path", ""),
    "rollout.name": ("rollout.engine", "vllm or hf"),
    "gamma": ("algo.ppo.gamma", ""),
    "lam": ("algo.ppo.lam", ""),
    "cliprange_value": ("algo.ppo.value_clip", ""),
    # ---- OpenRLHF (command line)
    "pretrain": ("model.name_or_path", ""),
    "n_samples_per_prompt": ("algo.group_size", ""),
    "rollout_batch_size": ("algo.prompts_per_step", "prompts per rollout batch"),
    "train_batch_size": (
        "algo.minibatches",
        "OpenRLHF counts samples per optimizer step; rlvr counts optimizer steps per batch: "
        "algo.minibatches = prompts_per_step x group_size / train_batch_size",
    ),
    "micro_train_batch_size": ("algo.micro_batch_size", ""),
    "micro_rollout_batch_size": ("rollout.batch_size", ""),
    "max_epochs": ("algo.epochs_per_batch", "passes over each rollout batch"),
    "num_episodes": (
        None,
        "rlvr counts steps: set train.max_steps (`rlvr train --dry-run` prints the epochs)",
    ),
    "prompt_max_len": ("data.max_prompt_tokens", "a longer prompt is an error in rlvr"),
    "generate_max_len": ("rollout.max_new_tokens", ""),
    "generate_max_length": ("rollout.max_new_tokens", ""),
    "max_tokens": ("rollout.max_new_tokens", ""),
    "actor_learning_rate": ("train.lr", ""),
    "critic_learning_rate": ("algo.ppo.value_lr", ""),
    "init_kl_coef": ("algo.beta", ""),
    "kl_coef": ("algo.beta", ""),
    "kl_penalty_coef": ("algo.beta", ""),
    "kl_target": ("algo.kl_target", ""),
    "kl_estimator": ("algo.kl_estimator", ""),
    "advantage_estimator": ("algo.objective", ""),
    "eps_clip": ("algo.clip_low", "and algo.clip_high: OpenRLHF's eps_clip bounds both sides"),
    "eps_clip_low_high": ("algo.clip_high", "and algo.clip_low"),
    "value_clip": ("algo.ppo.value_clip", ""),
    "lambd": ("algo.ppo.lam", ""),
    "prompt_data": ("data.train_path", ""),
    "input_key": ("data.prompt_field", ""),
    "label_key": ("data.answer_field", ""),
    "apply_chat_template": ("data.template", "data.template=chat (the default)"),
    "prompt_template": ("data.template", ""),
    "max_ckpt_num": ("train.max_checkpoints", ""),
    "save_path": ("train.output_dir", ""),
    "l2": ("train.weight_decay", ""),
    "max_norm": ("train.max_grad_norm", ""),
    "zero_stage": (None, "several processes shard with train.parallel=fsdp2 (the default)"),
    "entropy_loss_coef": ("algo.entropy_coef", ""),
    "dynamic_filtering": ("algo.dynamic_sampling", ""),
    "packing_samples": (None, "rlvr packs and shares prompts by itself (algo.share_prompt)"),
    "flash_attn": ("model.attention", ""),
    "model": ("model.name_or_path", ""),
    "warmup_steps": ("train.warmup_steps", ""),
}


# A near-miss leaf that more keys than this share gets no suggestion: naming one would be a guess.
MAX_SHARED_LEAF = 3


def edit_distance(a: str, b: str) -> int:
    """Optimal string alignment distance: insertions, deletions, substitutions and swaps of two
    neighbouring characters each cost 1 ('weigth' -> 'weight' is 1)."""
    rows = [list(range(len(b) + 1))]
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            row[j] = min(rows[i - 1][j] + 1, row[j - 1] + 1, rows[i - 1][j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], rows[i - 2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]


def near_miss(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate ``name`` is a typo of: at most one edit per five characters (at least one,
    and fewer than the name has: 'r' is a typo of nothing), the closest first; None when none is
    that close."""
    allowed = max(1, len(name) // 5)
    best = None
    for cand in candidates:
        d = edit_distance(name, cand)
        if d <= allowed and d < len(name) and (best is None or d < best[0]):
            best = (d, cand)
    return best[1] if best else None


def peer_entry(dotted: str) -> tuple[str, str | None, str] | None:
    """(the peer name matched, rlvr key or None, note) for an unknown dotted key, trying its
    longest dotted suffix first; None when no peer uses the name."""
    parts = dotted.split(".")
    for start in range(len(parts)):
        name = ".".join(parts[start:])
        if name in PEER_NAMES:
            key, note = PEER_NAMES[name]
            return name, key, note
    return None


def unknown_key_message(
    dotted: str, leaves: list[str], siblings: list[str], all_keys: list[str]
) -> str:
    """The error for an unknown key: its peer meaning, else a near-miss of a real key, else the
    plain refusal. ``leaves``: the unknown key's own dotted leaves when its value is a mapping
    (verl's ``actor_rollout_ref.rollout.n=8`` arrives as one unknown ``actor_rollout_ref``);
    ``siblings``: the known names beside it; ``all_keys``: every known dotted key."""
    for candidate in [*leaves, dotted]:
        found = peer_entry(candidate)
        if found is None:
            continue
        name, key, note = found
        head = f"unknown config key {candidate!r}"
        if key is None:
            return f"{head}: rlvr has no such knob; {note}"
        return f"{head}{f' ({note})' if note else ''}; did you mean {key!r}?"
    known = set(all_keys)
    for candidate in leaves:  # a peer's section around one of ours (verl's actor_rollout_ref.)
        parts = candidate.split(".")
        tails = [".".join(parts[i:]) for i in range(1, len(parts) - 1)]
        tail = next((t for t in tails if t in known), None)
        if tail is not None:
            return f"unknown config key {candidate!r}; did you mean {tail!r}?"
    head = f"unknown config key {dotted!r}"
    leaf = dotted.rsplit(".", 1)[-1]
    prefix = dotted[: -len(leaf)]
    close = near_miss(leaf, siblings)
    if close is not None:
        return f"{head}; did you mean {prefix + close!r}?"
    by_leaf: dict[str, list[str]] = {}
    for k in all_keys:
        by_leaf.setdefault(k.rsplit(".", 1)[-1], []).append(k)
    close = near_miss(leaf, by_leaf)
    if close is None or len(by_leaf[close]) > MAX_SHARED_LEAF:
        return head  # a leaf many sections share (enabled, action): any one would be a guess
    keys = by_leaf[close]
    if len(keys) == 1:
        return f"{head}; did you mean {keys[0]!r}?"
    return f"{head}; did you mean one of {', '.join(repr(k) for k in keys)}?"
