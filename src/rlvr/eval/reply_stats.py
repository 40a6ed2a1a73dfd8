"""How replies ended and how long they were: printed beside every pass@k / maj@k.

A score over replies that mostly hit the token limit measures the limit as much as the model
(44 of 100 greedy float32 replies of SmolLM2-135M stopped at 48 tokens on the demo's held-out
set), so every mode's scores come with these two numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

TRUNCATED = "truncated_frac"
MEAN_LEN = "mean_reply_tokens"


def reply_stats(records: Sequence[Mapping], mode: str) -> dict[str, float]:
    """``<mode>/truncated_frac`` (share of replies that hit max_new_tokens) and
    ``<mode>/mean_reply_tokens`` (mean reply length in tokens) over every reply of ``records``.

    Records need "finish_reasons" and "lengths" (as `generate_records` writes them).
    """
    reasons = [r for record in records for r in record["finish_reasons"]]
    lengths = [n for record in records for n in record["lengths"]]
    if not reasons or len(reasons) != len(lengths):
        raise ValueError(
            f"reply_stats: {len(reasons)} finish reasons and {len(lengths)} lengths; "
            "need one of each per reply"
        )
    return {
        f"{mode}/{TRUNCATED}": sum(r == "length" for r in reasons) / len(reasons),
        f"{mode}/{MEAN_LEN}": sum(lengths) / len(lengths),
    }
