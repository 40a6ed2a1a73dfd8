"""Summaries of one step's rollout and update, under the metric names of the JSONL contract."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from rlvr.rollout.base import Completion

if TYPE_CHECKING:
    from rlvr.objectives.batch import RolloutBatch

# Statistics of policy_loss that are averaged over micro-batches, and those that take the extreme.
_MEAN_KEYS = (
    "ratio_mean",
    "clip_frac_low",
    "clip_frac_high",
    "approx_kl",
    "kl",
    "value_clip_frac",
    "value_mean",
    "return_mean",
    "maxent_clip_term",
    "maxent_active_groups",
)
_MAX_KEYS = ("ratio_max", "log_ratio_max", "log_ratio_clamped_max", "log_ratio_abs_p99")
_MIN_KEYS = ("ratio_min", "log_ratio_min")
_SUM_KEYS = ("policy_loss", "value_loss", "maxent_listwise_loss")
_SKIP_KEYS = ("tokens", "nonfinite_loss")  # per micro-batch counts, meaningless as a step value


def _fold(key: str) -> str:
    """How a statistic is folded over micro-batches: the named lists above, else by its name
    (``*_max`` max, ``*_min`` min, anything else the mean), so an objective's own statistics
    (``seq_clip_frac``, ``cispo_weight_max``) reach the metrics without an entry here."""
    for kind, keys in (("mean", _MEAN_KEYS), ("max", _MAX_KEYS), ("min", _MIN_KEYS)):
        if key in keys:
            return kind
    if key in _SUM_KEYS:
        return "sum"
    if key in _SKIP_KEYS:
        return "skip"
    return "max" if key.endswith("_max") else "min" if key.endswith("_min") else "mean"


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else 0.0


def rollout_metrics(
    scores: torch.Tensor, valid: torch.Tensor, comps: list[Completion], rewards, max_new_tokens: int
) -> dict[str, float]:
    """Reward, correctness, length and truncation statistics of one rollout batch.

    scores/valid: ``[P, G]``. ``rewards`` is the reward runner's BatchRewards.
    """
    m: dict[str, float] = {}
    v = scores[valid].numpy()
    if v.size:
        m.update(
            reward_mean=float(v.mean()),
            reward_std=float(v.std()),
            reward_min=float(v.min()),
            reward_max=float(v.max()),
            reward_p90=_pct(v, 90),
        )
    else:
        m.update(reward_mean=0.0, reward_std=0.0, reward_min=0.0, reward_max=0.0, reward_p90=0.0)
    m.update(rewards.metrics())
    # the model's tokens (an episode's environment tokens are not its reply length)
    lengths = np.array([c.model_token_count for c in comps], dtype=float)
    m.update(
        response_len_mean=float(lengths.mean()),
        response_len_max=float(lengths.max()),
        response_len_p10=_pct(lengths, 10),
        response_len_p50=_pct(lengths, 50),
        response_len_p90=_pct(lengths, 90),
        truncation_rate=float(np.mean([c.truncated for c in comps])),
    )
    m.update(episode_metrics(comps))
    # A group whose valid rewards are all equal carries no GRPO signal.
    spread = []
    for row, ok in zip(scores, valid, strict=True):
        r = row[ok]
        spread.append(bool(r.numel() < 2 or float(r.max() - r.min()) <= 1e-8))
    m["zero_var_group_frac"] = float(np.mean(spread))
    infos = rewards.infos
    if infos and any("correct" in i for i in infos):
        # High reward but wrong: a non-exact reward (format, PRM, partial credit) paying for wrong answers.
        flat = scores.reshape(-1).tolist()
        hi_wrong = [
            s >= 0.5 and i.get("correct", 1.0) < 0.5
            for s, i, ok in zip(flat, infos, valid.reshape(-1).tolist(), strict=True)
            if ok
        ]
        m["high_reward_wrong_rate"] = float(np.mean(hi_wrong)) if hi_wrong else 0.0
    return m


def episode_metrics(comps: list[Completion]) -> dict[str, float]:
    """Multi-turn episodes (env.name): model turns, tool calls, the share of tool calls that
    failed, the share of episodes whose environment failed, and their tokens split between the
    model and the environment; {} for single-turn replies."""
    eps = [c.episode for c in comps if c.episode is not None]
    if not eps:
        return {}
    calls = sum(e.tool_calls for e in eps)
    return {
        "turns_mean": float(np.mean([e.turns for e in eps])),
        "tool_calls_mean": calls / len(eps),
        "tool_failure_rate": sum(e.tool_failures for e in eps) / calls if calls else 0.0,
        "env_failure_rate": float(np.mean([bool(e.failed) for e in eps])),
        "episode_model_tokens_mean": float(np.mean([e.model_tokens for e in eps])),
        "episode_env_tokens_mean": float(np.mean([e.env_tokens for e in eps])),
        "turns_limit_rate": float(np.mean([c.finish_reason == "turns" for c in comps])),
    }


def summarize_update_stats(
    stats: list[dict], entropies: list[torch.Tensor], grad_norms: list[float]
) -> dict:
    """Fold per-micro-batch loss statistics and per-optimizer-step grad norms into step metrics."""
    out: dict[str, float] = {}
    n_opt = max(1, len(grad_norms))
    keys = dict.fromkeys(k for s in stats for k in s)  # first-seen order
    for key in keys:
        vals = [s[key] for s in stats if key in s]
        kind = _fold(key)
        if kind == "mean":
            out[key] = float(np.mean(vals))
        elif kind == "max":
            out[key] = float(np.max(vals))
        elif kind == "min":
            out[key] = float(np.min(vals))
        elif kind == "sum":
            # micro-batch losses sum to the minibatch loss; average that over optimizer steps
            out[key] = float(np.sum(vals)) / n_opt
    ent = torch.cat(entropies).numpy() if entropies else np.zeros(0)
    if ent.size:
        out.update(
            entropy_mean=float(ent.mean()), entropy_p10=_pct(ent, 10), entropy_p90=_pct(ent, 90)
        )
    if grad_norms:
        out["grad_norm"] = float(np.mean(grad_norms))
        out["grad_norm_max"] = float(np.max(grad_norms))
    out["optimizer_steps"] = float(len(grad_norms))
    return out


def advantage_stats(batch: RolloutBatch) -> dict[str, float]:
    """adv_mean/std over valid sequences, min/max over all, of the per-sequence advantage (a
    token advantage counts by its mean over the sequence's model tokens)."""
    adv = batch.advantages
    if not isinstance(adv, torch.Tensor):
        adv = batch.model_token_means(adv)
    valid = batch.valid.reshape(-1)
    has = bool(valid.any())
    return {
        "adv_mean": float(adv[valid].mean()) if has else 0.0,
        "adv_std": float(adv[valid].std(unbiased=False)) if has else 0.0,
        "adv_min": float(adv.min()),
        "adv_max": float(adv.max()),
    }
