"""Figures from per-step records: medians and spreads, token rates, FLOP/s, time to target.

A step record is what a worker reports per step (see ``worker_rlvr`` / ``worker_trl``):

- ``wall_s``: the step's wall time (from the end of the previous step, waiting excluded);
- ``phases``: seconds per phase, keys among ``PHASES`` (a side reports the ones it can time);
- ``completion_tokens`` / ``prompt_tokens``: real (non-padding) tokens over the step's sequences;
- ``reward_mean``: mean training reward of the step's completions.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

PHASES = ("generate", "reward", "logprob", "update", "sync")


def quartiles(xs: Sequence[float]) -> tuple[float, float, float]:
    """(Q1, median, Q3) with linear interpolation between order statistics (numpy's default).

    One value gives (x, x, x). Raises ValueError on an empty sequence.
    """
    if not xs:
        raise ValueError("quartiles of an empty sequence")
    if len(xs) == 1:
        return float(xs[0]), float(xs[0]), float(xs[0])
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def rolling_mean(xs: Sequence[float], window: int) -> list[float | None]:
    """Mean of each full trailing window: entry i averages xs[i-window+1 .. i]; None before that."""
    if window < 1:
        raise ValueError(f"window={window}: must be >= 1")
    out: list[float | None] = []
    for i in range(len(xs)):
        if i + 1 < window:
            out.append(None)
        else:
            out.append(sum(xs[i + 1 - window : i + 1]) / window)
    return out


def time_to_target(records: Sequence[dict], threshold: float, window: int = 3) -> dict | None:
    """First step whose trailing ``window``-step mean reward reaches ``threshold``.

    Returns ``{"step": 1-based step, "seconds": summed wall_s of steps 1..step}`` or None when no
    step gets there. The time counts step time only (model loading is reported separately).
    """
    rewards = [float(r["reward_mean"]) for r in records]
    for i, m in enumerate(rolling_mean(rewards, window)):
        if m is not None and m >= threshold:
            return {"step": i + 1, "seconds": sum(float(r["wall_s"]) for r in records[: i + 1])}
    return None


def training_flops(
    nonembed_params: int, head_params: int, prompt_tokens: int, completion_tokens: int
) -> float:
    """Approximate FLOPs of one forward + backward pass over a step's sequences.

    6 FLOPs per parameter per token (2 forward, 4 backward) for the transformer body over every
    real token (prompt and completion: the backward runs through the prompt's activations too),
    plus 6 per LM-head parameter for completion tokens only (both sides ask the model for the
    logits of completion positions alone). Attention-score FLOPs and padding are not counted.
    Example: body 100, head 10, 3 prompt + 2 completion tokens -> 6*(100*5 + 10*2) = 3120.
    """
    for name, v in (
        ("nonembed_params", nonembed_params),
        ("head_params", head_params),
        ("prompt_tokens", prompt_tokens),
        ("completion_tokens", completion_tokens),
    ):
        if v < 0:
            raise ValueError(f"{name}={v}: must be >= 0")
    return 6.0 * (
        nonembed_params * (prompt_tokens + completion_tokens) + head_params * completion_tokens
    )


def safe_ratio(num, den) -> float | None:
    """num / den, or None when either is missing (None) or den is not positive."""
    ok = isinstance(num, int | float) and isinstance(den, int | float) and den > 0
    return num / den if ok else None


def summarize_side(
    records: Sequence[dict], warmup: int, model_info: dict, peak_flops: float | None
) -> dict:
    """The per-side figures over the steps after ``warmup``.

    ``model_info`` has ``nonembed_params`` and ``head_params``; ``peak_flops`` is the measured
    bf16 matmul peak in FLOP/s (None leaves the fraction out). Token rates are totals over the
    measured steps divided by the total time of the phase, so long steps weigh in proportion.
    """
    if warmup < 0:
        raise ValueError(f"warmup={warmup}: must be >= 0")
    measured = list(records[warmup:])
    if not measured:
        raise ValueError(
            f"no steps left after {warmup} warm-up steps (got {len(records)} steps): "
            "run more steps or lower the warm-up"
        )
    walls = [float(r["wall_s"]) for r in measured]
    q1, med, q3 = quartiles(walls)
    comp = sum(int(r["completion_tokens"]) for r in measured)
    phase_totals: dict[str, float] = {}
    phase_medians: dict[str, float] = {}
    for p in PHASES:
        vals = [float(r["phases"][p]) for r in measured if p in r.get("phases", {})]
        if len(vals) == len(measured):
            phase_totals[p] = sum(vals)
            phase_medians[p] = quartiles(vals)[1]
    others = [
        float(r["wall_s"]) - sum(float(v) for v in r.get("phases", {}).values()) for r in measured
    ]
    phase_medians["other"] = quartiles(others)[1]
    out: dict = {
        "steps": len(records),
        "measured_steps": len(measured),
        "step_time_median_s": med,
        "step_time_q1_s": q1,
        "step_time_q3_s": q3,
        "step_time_iqr_s": q3 - q1,
        "phase_median_s": phase_medians,
        "completion_tokens_per_step": comp / len(measured),
        "completion_len_mean": comp / sum(int(r["sequences"]) for r in measured),
        "reward_mean": sum(float(r["reward_mean"]) for r in measured) / len(measured),
        "e2e_tokens_per_s": safe_ratio(comp, sum(walls)),
        "gen_tokens_per_s": safe_ratio(comp, phase_totals.get("generate", 0.0)),
        "trained_tokens_per_s": safe_ratio(comp, phase_totals.get("update", 0.0)),
    }
    flops = sum(
        training_flops(
            model_info["nonembed_params"],
            model_info["head_params"],
            int(r["prompt_tokens"]),
            int(r["completion_tokens"]),
        )
        for r in measured
    )
    achieved = safe_ratio(flops, phase_totals.get("update", 0.0))
    out["train_flops_per_s"] = achieved
    out["train_peak_fraction"] = (
        achieved / peak_flops if achieved is not None and peak_flops else None
    )
    return out


def side_ratios(ours: dict, peer: dict) -> dict:
    """rlvr / TRL for each shared figure (below 1 is better for times and memory)."""
    keys = (
        "step_time_median_s",
        "e2e_tokens_per_s",
        "gen_tokens_per_s",
        "trained_tokens_per_s",
        "train_peak_fraction",
        "peak_rss_mb",
        "time_to_target_s",
    )
    out = {}
    for k in keys:
        out[k] = safe_ratio(ours.get(k), peer.get(k))
    return out
