"""The metric names the trainer emits in each step's dict (flat keys; the contract).

Any key may be missing on a given step (``kl`` when beta = 0, eval keys on non-eval steps), so
readers look keys up with ``.get``. The report lists the contract keys a run never logged, which
makes a metric that silently stopped being produced visible (a dashboard panel mapped to a key
nobody produces shows nothing, and nobody notices for a whole campaign).
"""

from __future__ import annotations

REWARD_KEYS = (
    "reward_mean",
    "reward_std",
    "reward_min",
    "reward_max",
    "reward_p90",
    "correct",
    "has_boxed",
    "has_answer",
    "reward_failure_rate",
    "high_reward_wrong_rate",
)
UPDATE_KEYS = (
    "grad_norm",  # before clipping
    "policy_loss",
    "kl",  # chosen estimator, per-token mean; absent when not measured
    "clip_frac_low",
    "clip_frac_high",
    "adv_mean",
    "adv_std",
    "adv_min",
    "adv_max",
    "entropy_mean",
    "entropy_p10",
    "entropy_p90",
    "log_ratio_max",
    "log_ratio_min",
    "log_ratio_clamped_max",
    "log_ratio_abs_p99",
    "ratio_mean",
    "ratio_min",
    "ratio_max",
    "approx_kl",
    "nonfinite_skipped",  # 1.0 when the update was skipped for a non-finite loss/grad
)
ROLLOUT_KEYS = (
    "response_len_mean",
    "response_len_max",
    "response_len_p10",
    "response_len_p50",
    "response_len_p90",
    "truncation_rate",
    "zero_var_group_frac",
    "logprob_diff_mean",  # engine vs trainer log-probs of the sampled tokens
    "logprob_diff_max",
    "logprob_k3",
)
TIMING_KEYS = (
    "time_rollout",
    "time_reward",
    "time_logprobs",  # the trainer's log-probs of the sampled tokens (old_logp), reference apart
    "time_reference",
    "time_prepare",  # the objective's advantages / weights
    "time_update",
    "time_sync",
    "time_eval",
    "time_step",
    "gen_tokens_per_s",
    "train_tokens_per_s",
)
# The phases whose times add up to (most of) time_step, in pipeline order.
PHASE_TIMING_KEYS = (
    "time_rollout",
    "time_reward",
    "time_logprobs",
    "time_reference",
    "time_prepare",
    "time_update",
    "time_sync",
    "time_eval",
)
# Memory (GiB), every step: the process's resident set at the step's end and its peak so far;
# with several processes the maximum over ranks, each rank's as ``<key>_rank<r>``.
MEMORY_KEYS = ("mem_rss_gib", "mem_rss_peak_gib")
# On a GPU (not in the contract: a CPU run never logs them): torch.cuda's max allocated and max
# reserved since the step began, and allocated at its end; ranks as above.
CUDA_MEMORY_KEYS = (
    "mem_cuda_max_allocated_gib",
    "mem_cuda_max_reserved_gib",
    "mem_cuda_allocated_gib",
)
# mem_engine_kv_gib: the engine's KV-cache budget where it is known (vLLM), every step;
# mem_plan_gib: the memory plan's peak, on a fresh run's first line only.
MEMORY_PLAN_KEY = "mem_plan_gib"
# policy_version: updates applied so far (the engine's weights are synced to it before generating
# or evaluating, every rollout.sync_every versions); kl_coef: the KL coefficient used this step;
# sync_*: the vLLM engine's weight-sync statistics on the steps that synced;
# params_trainable / params_total: parameter elements after model.freeze and LoRA (every step).
STEP_KEYS = ("step", "epoch", "lr", "policy_version", "params_trainable", "params_total")

# Multi-turn episodes only (env.name; rlvr.training.step_metrics.episode_metrics): kept out of
# METRIC_KEYS, whose missing keys the report lists for every run.
EPISODE_KEYS = (
    "turns_mean",
    "tool_calls_mean",
    "tool_failure_rate",
    "env_failure_rate",
    "episode_model_tokens_mean",
    "episode_env_tokens_mean",
    "turns_limit_rate",
)

METRIC_KEYS: tuple[str, ...] = (
    STEP_KEYS + REWARD_KEYS + UPDATE_KEYS + ROLLOUT_KEYS + TIMING_KEYS + MEMORY_KEYS
)

# Eval scores are logged as ``eval/<set_name>/<mode>``, e.g. ``eval/heldout/greedy_pass@1``.
EVAL_PREFIX = "eval/"


def eval_key(set_name: str, mode: str) -> str:
    """The metric key for eval set ``set_name`` scored in ``mode`` (``greedy_pass@1`` ...)."""
    if not set_name or "/" in set_name:
        raise ValueError(f"eval set_name must be non-empty and contain no '/', got {set_name!r}")
    if not mode or "/" in mode:
        raise ValueError(f"eval mode must be non-empty and contain no '/', got {mode!r}")
    return f"{EVAL_PREFIX}{set_name}/{mode}"
