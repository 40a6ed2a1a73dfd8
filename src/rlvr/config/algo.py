"""The `algo` section of the run config: the objective, its batch shape, clip and KL knobs, and the
subsections of the objectives that have their own (maxent, ppo, psgrpo, gspo_token, teacher) and
of the rollout correction."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlvr.config.base import Section


class MaxEntConfig(Section):
    tau: float = Field(0.5, description="Entropy temperature tau of the listwise target.")
    q_temperature: float = Field(2.0, description="Temperature of q = softmax(r / q_temperature).")
    q_eps: float = Field(1e-6, description="Floor of q: q <- q (1 - K q_eps) + q_eps.")
    length_normalize_ref: bool = Field(True, description="Reference log-probs per token.")
    length_normalize_policy: bool = Field(True, description="Policy log-probs per token.")
    skip_zero_variance_groups: bool = Field(
        True, description="Groups whose rewards are all equal add no listwise loss."
    )
    use_clip_objective: bool = Field(True, description="Add the clipped policy-gradient term.")
    clip_objective_coef: float = Field(1.0, description="Weight of the clipped term.")


class PPOConfig(Section):
    value_lr: float = Field(1e-5, gt=0, description="Learning rate of the value head.")
    value_clip: float = Field(0.2, gt=0, description="Clip of the value update.")
    gamma: float = Field(1.0, ge=0, le=1, description="GAE discount.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    value_coef: float = Field(1.0, gt=0, description="Weight of the value loss.")
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
    label_index: int = Field(0, description="The HF PRM's output column of a good step.")


# The rollout correction vLLM rollouts get where the config sets none
# (`rlvr.training.preflight.checks.apply_engine_defaults`): chosen by measurement, 5 seeds of the
# `target` workload with each correction (docs/performance.md, "Rollout correction with vLLM").
VLLM_ROLLOUT_CORRECTION: dict[str, str] = {"level": "token", "action": "truncate"}


class RolloutCorrectionConfig(Section):
    """Importance correction of the engine/trainer mismatch and of stale rollouts
    (docs/rollout.md, "Rollout correction"). The ratio is exp(trainer old log-prob - engine
    log-prob) per token; ``level=sequence`` takes one ratio per sequence, the product of its
    token ratios (the sequence's importance ratio, as verl and TRL take it); ``level=geometric``
    their geometric mean."""

    level: Literal["off", "token", "sequence", "geometric"] = Field(
        "off",
        description="off | token (one ratio per token) | sequence (the product of the token "
        "ratios, log-sum clamped to [-20, 20]) | geometric (their geometric mean). Unset, with "
        "vLLM rollouts and an objective that takes a correction: VLLM_ROLLOUT_CORRECTION's, "
        "chosen by measurement (docs/rollout.md); set off to turn it off.",
    )
    action: Literal["truncate", "mask", "reject"] = Field(
        "truncate",
        description="truncate: weight min(ratio, cap); mask: the ratio where it lies in "
        "[low, cap], 0 outside (verl's IS x RS, IcePop's mask; TRL's token_mask/sequence_mask "
        "with low=0); "
        "reject: 1 inside [low, cap], 0 outside (a rejection without importance weights).",
    )
    cap: float = Field(2.0, gt=0, description="C: the truncation cap, or the mask's upper bound.")
    low: float | None = Field(
        None,
        ge=0,
        description="The mask's lower bound; None: 1 / cap (verl's default); 0: no lower bound "
        "(TRL's one-sided mask, its clip_min unset). Only with action=mask or reject.",
    )

    def bounds(self) -> tuple[float, float]:
        """The mask's [low, high] range."""
        return (self.low if self.low is not None else 1.0 / self.cap), self.cap


class GSPOTokenConfig(Section):
    advantages: str = Field(
        "grpo",
        description="Where algo.objective=gspo_token takes its per-token advantages: grpo, "
        "drgrpo, rloo (one per sequence, on every token), psgrpo_steps or prm_dense (PRM step "
        "scores, per token).",
    )


class TeacherConfig(Section):
    name_or_path: str | None = Field(
        None,
        description="The teacher of algo.objective=distill: hub id or local folder, sharing the "
        "student's tokenizer; loaded once, frozen.",
    )
    reward_weight: float = Field(
        0.0,
        ge=0.0,
        description="Mix in the verifiable reward: each token's advantage adds reward_weight x "
        "its sequence's Dr.GRPO advantage (r - group mean). 0: pure distillation.",
    )


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
    clip_low: float = Field(0.2, ge=0.0, description="PPO clip below: ratio >= 1 - clip_low.")
    clip_high: float = Field(
        0.2, ge=0.0, description="Set above clip_low for clip-higher (e.g. 0.28)."
    )
    dual_clip: float | None = Field(None, description="Dual-clip constant c > 1, or None.")
    # = rlvr.algorithms.LOG_RATIO_CLAMP (config imports no torch; a test keeps the two equal)
    log_ratio_clamp: float = Field(20.0, gt=0, description="|log ratio| is clamped to this.")
    loss_agg: str = Field(
        "auto",
        description="token_mean | seq_mean_token_mean | seq_mean_token_sum_norm; 'auto' picks the objective's own.",
    )
    beta: float = Field(0.0, ge=0.0, description="KL coefficient; > 0 loads a reference policy.")
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3", description="KL estimator (k3: verl's low_var_kl, k1: kl, k2: mse)."
    )
    kl_mode: Literal["loss", "reward"] = Field(
        "loss", description="The KL as a loss term (verl use_kl_loss) or a reward penalty."
    )
    kl_target: float | None = Field(None, description="Adaptive KL target; None keeps beta fixed.")
    kl_horizon: int = Field(10000, description="Horizon of the adaptive KL controller.")
    entropy_coef: float = Field(0.0, description="Entropy bonus coefficient.")
    adv_eps: float = Field(1e-6, description="Added to the group's std (grpo).")
    dynamic_sampling: bool = Field(
        False,
        description="DAPO dynamic sampling: draw fresh prompts until the step has "
        "prompts_per_step groups whose rewards are not all equal (arXiv 2503.14476).",
    )
    dynamic_sampling_metric: Literal["accuracy", "score"] = Field(
        "accuracy",
        description="What dynamic sampling asks to differ within a group: accuracy (the "
        "verifier's correctness, its 'correct' info, as DAPO and verl filter) or score (the "
        "shaped reward, with any overlong penalty).",
    )
    dynamic_sampling_max_rounds: int = Field(
        3, ge=1, description="Most generation rounds per step with dynamic_sampling."
    )
    tis_cap: float | None = Field(
        None,
        gt=0,
        description="Truncated importance sampling: weight each token's policy-gradient term by "
        "min(exp(trainer old log-prob - engine log-prob), tis_cap) to correct the engine/trainer "
        "mismatch; null = off. Costs one no-grad forward pass per batch. The same as "
        "algo.rollout_correction level=token action=truncate cap=tis_cap.",
    )
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig)
    gspo_token: GSPOTokenConfig = Field(default_factory=GSPOTokenConfig)
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    maxent: MaxEntConfig = Field(default_factory=MaxEntConfig)
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    psgrpo: PSGRPOStepsConfig = Field(default_factory=PSGRPOStepsConfig)

    def correction(self) -> RolloutCorrectionConfig | None:
        """The rollout correction in force: ``rollout_correction``, or ``tis_cap`` as its
        token/truncate case; None when off."""
        if self.tis_cap is not None:
            return RolloutCorrectionConfig(level="token", action="truncate", cap=self.tis_cap)
        rc = self.rollout_correction
        return rc if rc.level != "off" else None
