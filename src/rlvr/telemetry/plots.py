"""Report figures: one function per plot, each returning a Figure or None when its data is absent.

Figures are built with ``matplotlib.figure.Figure`` directly (no pyplot), so drawing needs no
display, uses the Agg canvas and leaves matplotlib's global state alone. Every run gets the same
colour in every plot (``C0``, ``C1``, ... by position), and several runs share the same axes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from rlvr.telemetry.keys import EVAL_PREFIX, MEMORY_PLAN_KEY, PHASE_TIMING_KEYS
from rlvr.telemetry.report_data import RunData, rolling_mean, series

ROLLING_WINDOW = 5
MAX_GRAD_NORM_KEY = "train.max_grad_norm"
_STYLES = ("-", "--", ":", "-.")


def _color(index: int) -> str:
    return f"C{index % 10}"


def _figure(rows: int = 1, cols: int = 1, height: float = 3.2) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(7.5 if cols == 1 else 4.0 * cols, height * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def _finish(ax: Axes, title: str, ylabel: str) -> None:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="best")


def _any(runs: Sequence[RunData], keys: Sequence[str]) -> bool:
    return any(run.has(key) for run in runs for key in keys)


def _plot_line(ax: Axes, run_index: int, steps: np.ndarray, values: np.ndarray, **kw: Any) -> None:
    # A marker on every point keeps a one-step run visible (a line needs two points).
    ax.plot(steps, values, color=_color(run_index), marker=".", markersize=5, **kw)


def _failed_somewhere(runs: Sequence[RunData]) -> bool:
    return any(bool((series(run.metrics, "reward_failure_rate")[1] > 0).any()) for run in runs)


def plot_reward(runs: Sequence[RunData]) -> Figure | None:
    """reward_mean and correct per step (thin) with a trailing rolling mean (thick); the share
    of replies whose reward raised, where any did."""
    keys = [k for k in ("reward_mean", "correct") if _any(runs, [k])]
    if _failed_somewhere(runs):
        keys.append("reward_failure_rate")
    if not keys:
        return None
    fig, axes = _figure(len(keys))
    for ax, key in zip(axes, keys, strict=True):
        for i, run in enumerate(runs):
            steps, values = series(run.metrics, key)
            if not len(steps):
                continue
            _plot_line(ax, i, steps, values, alpha=0.35, linewidth=1)
            smooth = rolling_mean(values, ROLLING_WINDOW)
            ax.plot(steps, smooth, color=_color(i), linewidth=2.2, label=run.label)
        if key == "reward_failure_rate":
            ax.set_ylim(-0.02, 1.02)
            title = "reward_failure_rate: replies whose reward raised (no score, no gradient)"
        else:
            title = f"{key} (thick: rolling mean of {ROLLING_WINDOW})"
        _finish(ax, title, key)
    return fig


# The eval panels: each its own y-axis, so a 0-1 accuracy never shares one with a reply length.
EVAL_PANELS = (
    ("Held-out accuracy (0-1)", "accuracy", lambda k: "@" in k, True),
    (
        "Share of held-out replies cut at the token limit / not graded (0-1)",
        "share",
        lambda k: k.endswith(("_frac", "_rate")),
        True,
    ),
    ("Held-out reply length", "tokens", lambda k: k.endswith("_tokens"), False),
)


def plot_eval(runs: Sequence[RunData]) -> Figure | None:
    """Every ``eval/<set>/<metric>``: accuracies on a 0-1 axis of their own, the shares of cut
    and ungraded replies on another, reply lengths on a third; colour = run, line style = key,
    legends beside the axes (never over the lines)."""
    eval_keys = sorted({k for run in runs for k in run.logged_keys() if k.startswith(EVAL_PREFIX)})
    eval_keys = [k for k in eval_keys if _any(runs, [k])]
    panels = [
        (title, ylabel, [k for k in eval_keys if pick(k[len(EVAL_PREFIX) :])], unit)
        for title, ylabel, pick, unit in EVAL_PANELS
    ]
    panels = [p for p in panels if p[2]]
    if not panels:
        return None
    fig, axes = _figure(len(panels), height=2.8)
    for ax, (title, ylabel, keys, unit) in zip(axes, panels, strict=True):
        for i, run in enumerate(runs):
            for j, key in enumerate(keys):
                steps, values = series(run.metrics, key)
                if len(steps):
                    label = f"{run.label}: {key[len(EVAL_PREFIX) :]}"
                    style = _STYLES[j % len(_STYLES)]
                    _plot_line(ax, i, steps, values, linestyle=style, label=label)
        if unit:
            ax.set_ylim(-0.02, 1.02)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step (0: before training)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


def _multi_key_plot(
    runs: Sequence[RunData], keys: Sequence[str], title: str, ylabel: str, *, log_y: bool = False
) -> Figure | None:
    """Colour = run, line style = metric key."""
    keys = [k for k in keys if _any(runs, [k])]
    if not keys:
        return None
    fig, (ax,) = _figure()
    positive = True
    for i, run in enumerate(runs):
        for j, key in enumerate(keys):
            steps, values = series(run.metrics, key)
            if not len(steps):
                continue
            finite = values[np.isfinite(values)]
            positive = positive and bool(np.all(finite > 0))
            label = run.label if len(keys) == 1 else f"{run.label}: {key}"
            _plot_line(ax, i, steps, values, linestyle=_STYLES[j % len(_STYLES)], label=label)
    if log_y and positive:
        ax.set_yscale("log")
    _finish(ax, title, ylabel)
    return fig


def plot_kl(runs: Sequence[RunData]) -> Figure | None:
    """KL to the reference policy (``kl``, the configured estimator)."""
    return _multi_key_plot(runs, ["kl"], "KL to reference (per-token mean)", "kl")


def plot_grad_norm(runs: Sequence[RunData]) -> Figure | None:
    """grad_norm before clipping, with each run's ``train.max_grad_norm`` as a dashed line."""
    fig = _multi_key_plot(
        runs, ["grad_norm"], "Gradient norm before clipping", "grad_norm", log_y=True
    )
    if fig is None:
        return None
    return _run_lines(fig, runs, _grad_clip_line)


def _grad_clip_line(run: RunData) -> tuple[float, str] | None:
    threshold = (run.config or {}).get(MAX_GRAD_NORM_KEY)
    if isinstance(threshold, int | float) and not isinstance(threshold, bool):
        return float(threshold), f"max_grad_norm = {threshold:g}"
    return None


def _run_lines(
    fig: Figure, runs: Sequence[RunData], line: Callable[[RunData], tuple[float, str] | None]
) -> Figure:
    """A dashed horizontal line per run in the run's colour, at ``line(run)``'s (height, label)
    (none where it returns None)."""
    ax = fig.axes[0]
    for i, run in enumerate(runs):
        found = line(run)
        if found is not None:
            height, label = found
            ax.axhline(
                height, color=_color(i), linestyle="--", linewidth=1, label=f"{run.label}: {label}"
            )
    ax.legend(fontsize=7, loc="best")
    return fig


def _band_plot(
    runs: Sequence[RunData], mid: str, low: str, high: str, ax: Axes, title: str
) -> None:
    for i, run in enumerate(runs):
        steps, values = series(run.metrics, mid)
        if not len(steps):
            continue
        _plot_line(ax, i, steps, values, label=run.label)
        low_steps, low_values = series(run.metrics, low)
        high_steps, high_values = series(run.metrics, high)
        if len(low_steps) and np.array_equal(low_steps, high_steps):
            ax.fill_between(low_steps, low_values, high_values, color=_color(i), alpha=0.15)
    _finish(ax, title, mid)


def plot_entropy(runs: Sequence[RunData]) -> Figure | None:
    """entropy_mean with the p10..p90 band."""
    if not _any(runs, ["entropy_mean"]):
        return None
    fig, (ax,) = _figure()
    _band_plot(
        runs, "entropy_mean", "entropy_p10", "entropy_p90", ax, "Token entropy (band: p10-p90)"
    )
    return fig


def plot_length(runs: Sequence[RunData]) -> Figure | None:
    """Response length (mean, p10..p90 band) and truncation rate."""
    panels = [k for k in ("response_len_mean", "truncation_rate") if _any(runs, [k])]
    if not panels:
        return None
    fig, axes = _figure(len(panels))
    for ax, key in zip(axes, panels, strict=True):
        if key == "response_len_mean":
            _band_plot(
                runs,
                key,
                "response_len_p10",
                "response_len_p90",
                ax,
                "Response length in tokens (band: p10-p90)",
            )
        else:
            for i, run in enumerate(runs):
                steps, values = series(run.metrics, key)
                if len(steps):
                    _plot_line(ax, i, steps, values, label=run.label)
            _finish(ax, "Truncation rate (responses that hit the length limit)", key)
    return fig


def plot_clip(runs: Sequence[RunData]) -> Figure | None:
    """Fraction of tokens clipped below (1 - eps) and above (1 + eps)."""
    return _multi_key_plot(
        runs, ["clip_frac_low", "clip_frac_high"], "Clipped-token fraction", "fraction"
    )


def plot_log_ratio(runs: Sequence[RunData]) -> Figure | None:
    """Tails of log(pi / pi_old): the usual source of gradient spikes."""
    return _multi_key_plot(
        runs,
        ["log_ratio_max", "log_ratio_abs_p99", "log_ratio_min"],
        "Log-ratio tails",
        "log ratio",
    )


def plot_logprob_mismatch(runs: Sequence[RunData]) -> Figure | None:
    """Engine vs trainer log-probs of the sampled tokens."""
    return _multi_key_plot(
        runs,
        ["logprob_k3", "logprob_diff_mean", "logprob_diff_max"],
        "Rollout engine vs trainer log-probs",
        "nats",
    )


def plot_timings(runs: Sequence[RunData]) -> Figure | None:
    """Seconds per phase, stacked bars per step; one panel per run (stacks do not overlay)."""
    with_times = [
        (i, run) for i, run in enumerate(runs) if any(run.has(k) for k in PHASE_TIMING_KEYS)
    ]
    if not with_times:
        return None
    fig, axes = _figure(len(with_times), height=2.8)
    for ax, (_, run) in zip(axes, with_times, strict=True):
        steps = np.unique(np.concatenate([series(run.metrics, k)[0] for k in PHASE_TIMING_KEYS]))
        bottom = np.zeros(len(steps))
        for j, key in enumerate(PHASE_TIMING_KEYS):
            key_steps, key_values = series(run.metrics, key)
            if not len(key_steps):
                continue
            heights = np.zeros(len(steps))
            positions = np.searchsorted(steps, key_steps)
            heights[positions] = np.nan_to_num(key_values, nan=0.0, posinf=0.0, neginf=0.0)
            ax.bar(steps, heights, bottom=bottom, color=f"C{j}", label=key[len("time_") :])
            bottom += heights
        total_steps, total = series(run.metrics, "time_step")
        if len(total_steps):
            ax.plot(total_steps, total, color="black", marker=".", linewidth=1, label="step total")
        _finish(ax, f"Phase timings: {run.label}", "seconds")
    return fig


def plot_memory(runs: Sequence[RunData]) -> Figure | None:
    """Peak and current RSS (and on a GPU torch.cuda's per-step peaks) per step, with each run's
    memory plan (its first line's ``mem_plan_gib``) as a dashed line in the run's colour."""
    keys = [
        "mem_rss_peak_gib",
        "mem_rss_gib",
        "mem_cuda_max_reserved_gib",
        "mem_cuda_max_allocated_gib",
    ]
    fig = _multi_key_plot(runs, keys, "Memory per step (max over ranks)", "GiB")
    if fig is None:
        return None
    return _run_lines(fig, runs, _plan_line)


def _plan_line(run: RunData) -> tuple[float, str] | None:
    _, plan = series(run.metrics, MEMORY_PLAN_KEY)
    return (float(plan[0]), f"memory plan {plan[0]:.2f} GiB") if len(plan) else None


# (file stem, caption, builder) in page order.
PLOTS: tuple[tuple[str, str, Callable[[Sequence[RunData]], Figure | None]], ...] = (
    ("reward", "Reward and correctness", plot_reward),
    ("eval", "Evaluation scores", plot_eval),
    ("kl", "KL divergence to the reference policy", plot_kl),
    ("grad_norm", "Gradient norm and the clipping threshold", plot_grad_norm),
    ("entropy", "Token entropy", plot_entropy),
    ("length", "Response length and truncation", plot_length),
    ("clip_frac", "Clipped-token fraction", plot_clip),
    ("log_ratio", "Log-ratio tails", plot_log_ratio),
    ("logprob_mismatch", "Rollout engine vs trainer log-probs", plot_logprob_mismatch),
    ("timings", "Phase timings", plot_timings),
    ("memory", "Memory per step against the memory plan (dashed)", plot_memory),
)
