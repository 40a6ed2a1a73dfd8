"""How replies ended and how long they were: printed beside every pass@k / maj@k.

A score over replies that mostly hit the token limit measures the limit as much as the model
(44 of 100 greedy float32 replies of SmolLM2-135M stopped at 48 tokens on the demo's held-out
set), so every mode's scores come with these two numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

TRUNCATED = "truncated_frac"
MEAN_LEN = "mean_reply_tokens"
REWARD_FAILED = "reward_failed_frac"  # only where some grading raised


def reply_stats(records: Sequence[Mapping], mode: str) -> dict[str, float]:
    """``<mode>/truncated_frac`` (share of replies that hit max_new_tokens) and
    ``<mode>/mean_reply_tokens`` (mean reply length in tokens) over every reply of ``records``.

    Records need "finish_reasons" and "lengths" (as `generate_records` writes them). Where
    some reply's grading raised ("reward_errors"), also ``<mode>/reward_failed_frac``.
    """
    reasons = [r for record in records for r in record["finish_reasons"]]
    lengths = [n for record in records for n in record["lengths"]]
    if not reasons or len(reasons) != len(lengths):
        raise ValueError(
            f"reply_stats: {len(reasons)} finish reasons and {len(lengths)} lengths; "
            "need one of each per reply"
        )
    out = {
        f"{mode}/{TRUNCATED}": sum(r == "length" for r in reasons) / len(reasons),
        f"{mode}/{MEAN_LEN}": sum(lengths) / len(lengths),
    }
    failed = [e is not None for record in records for e in record.get("reward_errors", [])]
    if any(failed):  # gradings that raised count as wrong answers: say how many
        out[f"{mode}/{REWARD_FAILED}"] = sum(failed) / len(failed)
    return out


def episode_stats(records: Sequence[Mapping], mode: str) -> dict[str, float]:
    """Over every episode of ``records`` (env.name set): ``<mode>/tool_call_rate`` (share of
    episodes with at least one tool call), ``<mode>/tool_calls_mean``, ``<mode>/turns_mean``
    (model turns) and ``<mode>/env_failure_rate``. Records need "turns", "tool_calls" and
    "env_failed" (as `generate_records` writes them for episodes)."""
    calls = [n for record in records for n in record["tool_calls"]]
    turns = [n for record in records for n in record["turns"]]
    failed = [bool(f) for record in records for f in record["env_failed"]]
    if not calls or not len(calls) == len(turns) == len(failed):
        raise ValueError(
            f"episode_stats: {len(calls)} tool-call counts, {len(turns)} turn counts and "
            f"{len(failed)} failure marks; need one of each per episode"
        )
    return {
        f"{mode}/tool_call_rate": sum(n > 0 for n in calls) / len(calls),
        f"{mode}/tool_calls_mean": sum(calls) / len(calls),
        f"{mode}/turns_mean": sum(turns) / len(turns),
        f"{mode}/env_failure_rate": sum(failed) / len(failed),
    }
