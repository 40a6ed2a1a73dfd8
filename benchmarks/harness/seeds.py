"""Several seeds per side: time to target as a distribution, not one run.

One run per side says nothing about sample efficiency (a lucky or unlucky seed moves the step
at which the reward reaches the target by more than most speed-ups), so ``--seeds 0,1,2,3,4``
repeats the whole side-by-side run per seed. This file summarises the runs per side (median and
range of steps and seconds to target, of the median step time; per seed against TRL's run, the
ratios and a sign test of the steps) and plots the rolling-mean reward of every run against its
wall time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from benchmarks.harness.stats import quartiles, rolling_mean, safe_ratio


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]``; ValueError naming the bad item or a repeated seed."""
    seeds = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        try:
            seeds.append(int(item))
        except ValueError:
            raise ValueError(f"--seeds={text!r}: {item!r} is not an integer") from None
    if not seeds:
        raise ValueError(f"--seeds={text!r}: no seed given")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds={text!r}: a seed is given twice")
    return seeds


def spread(values: Sequence[float | None]) -> dict:
    """Median, min, max of the values that exist, how many did not (None: target not reached),
    and the values themselves in seed order."""
    got = [float(v) for v in values if v is not None]
    out: dict = {"values": list(values), "missing": len(values) - len(got)}
    if got:
        out.update(median=quartiles(got)[1], min=min(got), max=max(got))
    else:
        out.update(median=None, min=None, max=None)
    return out


def sign_test(ours: Sequence[float | None], peer: Sequence[float | None]) -> dict:
    """Paired sign test of ``ours`` against ``peer``, seed by seed (lower is better, e.g. steps
    to target). None (target not reached within the step cap) counts as more than any number;
    two Nones are a tie. Ties are left out; ``p`` is the exact two-sided binomial p-value of the
    split between fewer and more under "either side is as likely to need fewer".

    A weak test on purpose: it asks only which side needed fewer steps per seed, so one seed with
    a long tail cannot decide it.
    """
    fewer = more = equal = 0
    for a, b in zip(ours, peer, strict=True):
        a_key = math.inf if a is None else float(a)
        b_key = math.inf if b is None else float(b)
        if a_key < b_key:
            fewer += 1
        elif a_key > b_key:
            more += 1
        else:
            equal += 1
    n = fewer + more
    tail = sum(math.comb(n, i) for i in range(min(fewer, more) + 1))
    p = min(1.0, 2 * tail / 2**n) if n else 1.0
    return {"fewer": fewer, "equal": equal, "more": more, "p": p}


PAIRED = (
    ("steps_to_target", "time_to_target_step"),
    ("seconds_to_target", "time_to_target_s"),
    ("step_time_median_s", "step_time_median_s"),
    ("peak_rss_mb", "peak_rss_mb"),
)


def _mean_reward(records: list[dict]) -> float | None:
    return sum(float(r["reward_mean"]) for r in records) / len(records) if records else None


def _mean_completion_len(records: list[dict]) -> float | None:
    """Tokens per completion over the records (None when they do not say)."""
    if not records or any("completion_tokens" not in r for r in records):
        return None
    return sum(int(r["completion_tokens"]) for r in records) / sum(
        int(r["sequences"]) for r in records
    )


def over_seeds(per_seed: dict[str, dict[str, dict]], peer: str = "trl") -> dict[str, dict]:
    """``{side: spreads}`` from ``{seed: {side: side_result}}`` (``side_result`` as step.py
    builds it: a ``summary`` dict). Every other side also gets ``vs_peer``: the spreads of its
    per-seed ratios to ``peer``'s run with the same seed (same prompts, so the pairing removes
    the seed's luck from the comparison; a seed where either side missed the target gives no
    ratio)."""
    sides: list[str] = []
    for runs in per_seed.values():
        sides += [s for s in runs if s not in sides]
    # a target run stops each side when it gets there: the steps every run made are the ones
    # that compare the sides' learning at equal sample counts
    common = min(len(res["steps"]) for runs in per_seed.values() for res in runs.values())
    out = {}
    for side in sides:
        summaries = [runs[side]["summary"] for runs in per_seed.values() if side in runs]
        first = [runs[side]["steps"][:common] for runs in per_seed.values() if side in runs]
        out[side] = {
            "runs": len(summaries),
            "common_steps": common,
            "reward_first_steps": spread([_mean_reward(r) for r in first]),
            "completion_len_first_steps": spread([_mean_completion_len(r) for r in first]),
            "steps_to_target": spread([s.get("time_to_target_step") for s in summaries]),
            "seconds_to_target": spread([s.get("time_to_target_s") for s in summaries]),
            "step_time_median_s": spread([s["step_time_median_s"] for s in summaries]),
            "peak_rss_mb": spread([s.get("peak_rss_mb") for s in summaries]),
        }
        if side == peer:
            continue
        pairs = [
            (runs[side]["summary"], runs[peer]["summary"])
            for runs in per_seed.values()
            if side in runs and peer in runs
        ]
        if pairs:
            out[side]["vs_peer"] = {
                key: spread([safe_ratio(a.get(field), b.get(field)) for a, b in pairs])
                for key, field in PAIRED
            }
            out[side]["steps_sign_test"] = sign_test(
                [a.get("time_to_target_step") for a, _ in pairs],
                [b.get("time_to_target_step") for _, b in pairs],
            )
    return out


TARGET_KEYS = ("steps_to_target", "seconds_to_target")


def _cell(sp: dict, fmt: str, key: str) -> str:
    """``median [min-max]`` of the figure ``key``, saying how many runs lack it and why."""
    missing = "not reached" if key in TARGET_KEYS else "not recorded"
    if sp["median"] is None:
        return f"{missing} ({sp['missing']} of {len(sp['values'])})"
    text = f"{fmt.format(sp['median'])} [{fmt.format(sp['min'])}-{fmt.format(sp['max'])}]"
    return text + (f", {sp['missing']} {missing}" if sp["missing"] else "")


def render_over_seeds(over: dict[str, dict], labels: dict[str, str]) -> list[str]:
    """Markdown lines: one row per figure, one column per side, ``median [min-max]``."""
    sides = list(over)
    runs = ", ".join(f"{labels.get(s, s)}: {over[s]['runs']} runs" for s in sides)
    lines = [
        "",
        f"Over seeds ({runs}); median [min-max]:",
        "",
        "| figure | " + " | ".join(labels.get(s, s) for s in sides) + " |",
        "|---|" + "---|" * len(sides),
    ]
    n = over[sides[0]].get("common_steps")
    figures = (
        ("steps to target", "steps_to_target", "{:.0f}"),
        ("seconds to target", "seconds_to_target", "{:.0f}"),
        ("step time, median (s)", "step_time_median_s", "{:.2f}"),
        ("peak RSS, children included (MB)", "peak_rss_mb", "{:.0f}"),
    )
    figures += (
        (f"training reward, mean of steps 1-{n}", "reward_first_steps", "{:.3f}"),
        (f"completion length, mean of steps 1-{n}", "completion_len_first_steps", "{:.1f}"),
    )
    # files written before a figure existed lack it: show what every side has
    figures = tuple(f for f in figures if all(f[1] in over[s] for s in sides))
    for name, key, fmt in figures:
        cells = [_cell(over[s][key], fmt, key) for s in sides]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if any("vs_peer" in over[s] for s in sides):
        paired = {key for key, _ in PAIRED}  # the figures vs_peer holds
        for name, key, _ in (f for f in figures if f[1] in paired):
            cells = [
                _cell(over[s]["vs_peer"][key], "{:.2f}", key)
                if key in over[s].get("vs_peer", {})
                else ""
                for s in sides
            ]
            lines.append(f"| {name}, ratio to TRL's same-seed run | " + " | ".join(cells) + " |")
    signs = [(s, over[s]["steps_sign_test"]) for s in sides if "steps_sign_test" in over[s]]
    if signs:
        lines.append("")
    for s, t in signs:
        lines.append(
            f"- Steps to target, {labels.get(s, s)} against TRL's same-seed run: fewer in "
            f"{t['fewer']} seed(s), as many in {t['equal']}, more in {t['more']} (a seed that "
            f"missed the target counts as more; two-sided sign test over the seeds that differ: "
            f"p = {t['p']:.2f})."
        )
    return lines


def plot_reward_vs_time(
    per_seed: dict[str, dict[str, dict]], path: Path, window: int, target: float | None
) -> Path:
    """One line per run (colour per side, one line per seed): the ``window``-step rolling mean
    training reward against the wall time of the steps so far (left) and against the step
    (right: sample efficiency, which equal settings must make equal on every side)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_step) = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    colours: dict[str, str] = {}
    for seed, runs in per_seed.items():
        for side, res in runs.items():
            steps = res["steps"]
            t, times = 0.0, []
            for r in steps:
                t += float(r["wall_s"])
                times.append(t)
            rolled = rolling_mean([float(r["reward_mean"]) for r in steps], window)
            pts = [(x, y) for x, y in zip(times, rolled, strict=True) if y is not None]
            if not pts:
                continue
            label = side if side not in colours else None
            (line,) = ax.plot(*zip(*pts, strict=True), color=colours.get(side), label=label, lw=1)
            colours.setdefault(side, line.get_color())
            ax.annotate(f"s{seed}", pts[-1], fontsize=7, color=colours[side])
            by_step = [(i + 1, y) for i, y in enumerate(rolled) if y is not None]
            ax_step.plot(*zip(*by_step, strict=True), color=colours[side], lw=1)
            ax_step.annotate(f"s{seed}", by_step[-1], fontsize=7, color=colours[side])
    for a in (ax, ax_step):
        if target is not None:
            a.axhline(target, color="grey", ls="--", lw=0.8, label=f"target {target}")
        a.grid(alpha=0.3)
    ax.set_xlabel("wall time of the steps (s)")
    ax_step.set_xlabel("step")
    ax.set_ylabel(f"training reward, {window}-step mean")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
