"""Evaluation maths over per-prompt records: greedy_pass@1, pass@k, maj@k, mean accuracy.

A record is one prompt's evaluation:

    {"prompt": str, "reference": str,
     "responses": list[str],          # n sampled or greedy responses
     "answers": list[str | None],     # extracted (normalised) answer of each; None = none found
     "correct": list[bool]}           # graded correctness of each

Only "correct" is needed by every metric and "answers" by maj@k; when "responses" or "answers"
are present their length must equal len(correct).

The modes are reported under different names and must never be compared with each other:

- greedy_pass@1        temperature 0, n = 1: fraction of prompts whose one response is correct.
- sampling_pass@k      temperature > 0, n >= k: the unbiased pass@k estimator of Chen et al.
                       (2021), the chance that at least one of k samples is correct.
- maj@k                the majority answer of the first k samples is correct.
- mean_acc@k           mean fraction of correct samples among the first k.
- nondet_proxy_pass@k  pass@k of temperature-0 runs with n > 1: only measures nondeterminism
                       of batched greedy decoding (a diagnostic, not a score).

"sampling_pass@8" is sometimes called "majority-vote accuracy"; here the two are separate
numbers, sampling_pass@k (any of k) and maj@k (the vote), so neither is mistaken for the other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

from rlvr.rewards.normalize import normalize_answer, parse_number

MODES = ("greedy", "sampling", "nondet_proxy")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k).

    Computed with exact integers and one final rounding, so it is stable for any n (the usual
    float product form loses digits when C(n, k) is huge). When n - c < k every k-subset holds
    a correct sample and C(n-c, k) = 0, so the result is 1.0.
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"pass_at_k: {name} must be an int, got {value!r}")
    if n < 1:
        raise ValueError(f"pass_at_k: n must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c must be in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k must be in [1, n={n}], got {k}")
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def greedy_pass_at_1(records: Sequence[Mapping]) -> float:
    """Fraction of prompts whose single greedy response is correct (each record has n = 1)."""
    _check_records(records)
    for index, record in enumerate(records):
        if len(record["correct"]) != 1:
            raise ValueError(
                f"greedy_pass@1 needs one response per record (temperature 0, n=1); record "
                f"{index} has {len(record['correct'])}: use mode 'sampling' or 'nondet_proxy'"
            )
    return sum(bool(record["correct"][0]) for record in records) / len(records)


def sampling_pass_at_k(records: Sequence[Mapping], k: int) -> float:
    """Mean over prompts of `pass_at_k(n, c, k)`, each record's n samples holding c correct."""
    _check_records(records, k)
    return sum(pass_at_k(len(r["correct"]), sum(r["correct"]), k) for r in records) / len(records)


def maj_at_k(records: Sequence[Mapping], k: int) -> float:
    """Fraction of prompts whose majority answer over the first k samples is correct.

    Votes count the extracted answers (exact string match; normalise them beforehand). A tie is
    won by the answer that appears first; None (no answer found) never wins, and a prompt whose
    k answers are all None counts as wrong. The vote is correct when the first sample that gave
    the winning answer is correct.
    """
    _check_records(records, k, need_answers=True)
    return sum(_majority_correct(r["answers"][:k], r["correct"][:k]) for r in records) / len(
        records
    )


def vote_key(answer: str) -> str:
    """What maj@k counts: the normalised answer, and one key per number whatever its spelling
    ("1,000", "1000" and "1000.0" vote together; so do "0.5", "1/2" and "\\frac{1}{2}")."""
    text = normalize_answer(answer)
    number = parse_number(text)
    return text if number is None else str(number)


def _majority_correct(answers: Sequence[str | None], correct: Sequence[bool]) -> bool:
    first_index: dict[str, int] = {}
    votes: dict[str, int] = {}
    for index, answer in enumerate(answers):
        if answer is None:
            continue
        key = vote_key(answer)
        first_index.setdefault(key, index)
        votes[key] = votes.get(key, 0) + 1
    if not votes:
        return False
    # Highest count wins; among equal counts the smaller first index wins.
    winner = max(votes, key=lambda key: (votes[key], -first_index[key]))
    return bool(correct[first_index[winner]])


def mean_accuracy(records: Sequence[Mapping], k: int | None = None) -> float:
    """Mean over prompts of the fraction of correct samples among the first k (all if k is None).

    Each prompt counts once, whatever its number of samples.
    """
    _check_records(records, k)
    return sum(sum(r["correct"][:k]) / len(r["correct"][:k]) for r in records) / len(records)


def summarize(records: Sequence[Mapping], mode: str, k: int | None = None) -> dict:
    """The metrics of one evaluation mode, under keys that carry the mode's name.

    - "greedy" (k None or 1): {"greedy_pass@1", "greedy/num_prompts"}
    - "sampling": {"sampling_pass@k", "maj@k", "mean_acc@k", "sampling/num_prompts"}
    - "nondet_proxy": {"nondet_proxy_pass@k", "nondet_proxy/num_prompts"}

    For the last two, k defaults to the records' sample count (which must then be the same for
    every record).
    """
    if mode not in MODES:
        raise ValueError(f"unknown eval mode {mode!r}; known: {', '.join(MODES)}")
    _check_records(records)
    if mode == "greedy":
        if k not in (None, 1):
            raise ValueError(f"mode 'greedy' measures pass@1; got k={k}")
        return {"greedy_pass@1": greedy_pass_at_1(records), "greedy/num_prompts": len(records)}
    if k is None:
        counts = sorted({len(record["correct"]) for record in records})
        if len(counts) > 1:
            raise ValueError(
                f"records have different sample counts {counts}; pass k (at most {counts[0]})"
            )
        k = counts[0]
    if mode == "nondet_proxy":
        return {
            f"nondet_proxy_pass@{k}": sampling_pass_at_k(records, k),
            "nondet_proxy/num_prompts": len(records),
        }
    return {
        f"sampling_pass@{k}": sampling_pass_at_k(records, k),
        f"maj@{k}": maj_at_k(records, k),
        f"mean_acc@{k}": mean_accuracy(records, k),
        "sampling/num_prompts": len(records),
    }


def format_table(results: Mapping) -> str:
    """A Markdown table of results.

    `results` is either one summary ({"greedy_pass@1": 0.5, ...}: rows are metrics) or a
    mapping of row labels to summaries ({"step 10": {...}, "step 20": {...}}: one row per
    label, one column per metric in first-seen order, "-" where a row lacks a metric).
    Floats are shown with 4 decimals.
    """
    if not results:
        raise ValueError("format_table: results is empty")
    nested = [isinstance(value, Mapping) for value in results.values()]
    if all(nested):
        columns: list[str] = []
        for summary in results.values():
            columns.extend(key for key in summary if key not in columns)
        header = ["", *columns]
        body = [
            [str(label), *(_cell(summary.get(col, "-")) for col in columns)]
            for label, summary in results.items()
        ]
    elif not any(nested):
        header = ["metric", "value"]
        body = [[str(key), _cell(value)] for key, value in results.items()]
    else:
        raise ValueError("format_table: give one summary or a mapping of label -> summary")
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return (
            "| " + " | ".join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True)) + " |"
        )

    separator = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), separator, *(line(row) for row in body)])


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def _check_records(
    records: Sequence[Mapping], k: int | None = None, need_answers: bool = False
) -> None:
    """Raise ValueError naming the record and field when records cannot be scored with k."""
    if isinstance(records, Mapping) or not isinstance(records, Sequence):
        raise TypeError(f"records must be a list of dicts, got {type(records).__name__}")
    if not records:
        raise ValueError("records is empty: nothing was evaluated")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"k must be a positive integer, got {k!r}")
    for index, record in enumerate(records):
        if not isinstance(record, Mapping) or "correct" not in record:
            raise ValueError(f"record {index} has no 'correct' list")
        correct = record["correct"]
        if not correct:
            raise ValueError(f"record {index}: 'correct' is empty (no responses)")
        if not all(isinstance(value, bool) for value in correct):
            raise ValueError(f"record {index}: 'correct' must hold booleans, got {correct!r}")
        for field in ("responses", "answers"):
            if field in record and len(record[field]) != len(correct):
                raise ValueError(
                    f"record {index}: {len(record[field])} {field} but {len(correct)} "
                    "'correct' values"
                )
        if need_answers and "answers" not in record:
            raise ValueError(f"record {index} has no 'answers' list (maj@k votes on them)")
        if k is not None and len(correct) < k:
            raise ValueError(f"record {index} has {len(correct)} samples, fewer than k={k}")
