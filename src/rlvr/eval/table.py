"""The eval table: one row per set and metric, with the mode, k, temperature and top-p that
produced the number, the share of replies cut at the token limit and the mean reply length.

A bare "pass@8" can be read as any-of-8 or as a majority vote (one published guide reports
majority accuracy as ``sampling_pass@8``); with the mode and its settings on the same row, and
the truncation beside it, a number cannot be read without how it was measured.
"""

from __future__ import annotations

from collections.abc import Mapping

from rlvr.config.eval import EvalModeConfig
from rlvr.eval.metrics import format_table
from rlvr.eval.reply_stats import MEAN_LEN, TRUNCATED


def mode_metrics(kind: str, k: int) -> list[str]:
    """The metric names a mode reports (``greedy_pass@1``; ``sampling_pass@k``, ``maj@k``, ...)."""
    return EvalModeConfig(kind=kind, k=None if kind == "greedy" else k).metric_names()


def eval_rows(
    results: Mapping[str, Mapping], modes: Mapping[str, list[dict]], problems: Mapping[str, int]
) -> dict[str, dict]:
    """``"<set> <metric>" -> {value, mode, k, temperature, top_p, truncated, mean_len, problems}``.

    ``results`` and ``modes`` are an `EvalOutcome`'s (or a results JSON's) fields.
    """
    rows: dict[str, dict] = {}
    for name, scores in results.items():
        for mode in modes.get(name, []):
            kind = mode["mode"]
            for metric in mode_metrics(kind, mode["k"]):
                if metric not in scores:
                    continue
                rows[f"{name} {metric}"] = {
                    "value": scores[metric],
                    "mode": kind,
                    "k": mode["k"],
                    "temperature": f"{mode['temperature']:g}",
                    "top_p": f"{mode['top_p']:g}",
                    "truncated": scores.get(f"{kind}/{TRUNCATED}", "-"),
                    "mean_len": _tokens(scores.get(f"{kind}/{MEAN_LEN}")),
                    "problems": problems.get(name, "-"),
                }
    return rows


def eval_table(
    results: Mapping[str, Mapping], modes: Mapping[str, list[dict]], problems: Mapping[str, int]
) -> str:
    """The Markdown table `rlvr eval` prints (see `eval_rows`)."""
    return format_table(eval_rows(results, modes, problems))


def _tokens(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, float) else "-"
