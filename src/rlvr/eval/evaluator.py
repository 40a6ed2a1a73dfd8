"""Evaluation through exactly the code training uses: the same template, engine and reward runner.

Seed 001's evaluation took a different path from its rollouts and under-reported accuracy by
12.8 points; here `rlvr eval`, `rlvr data filter-difficulty` and the in-training evaluator all
call `generate_records()` (through `evaluate_sets()` / `evaluate()`), and both evaluators write
their results with `eval_payload()`, so their files can be compared record for record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rlvr.config.eval import EvalModeConfig
from rlvr.data.templates import render_rows
from rlvr.eval.metrics import summarize
from rlvr.rewards.math import extract_answer
from rlvr.rollout.base import SamplingParams
from rlvr.telemetry.jsonio import atomic_write_text


@dataclass(frozen=True)
class EvalMode:
    """One named evaluation mode: ``greedy`` (temperature 0, n 1) or ``sampling`` (n = k)."""

    kind: str = "greedy"
    k: int = 1
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ("greedy", "sampling"):
            raise ValueError(f"unknown eval mode {self.kind!r}; known: greedy, sampling")
        if self.kind == "greedy" and self.k != 1:
            raise ValueError(f"greedy mode has one response per problem, got k={self.k}")
        if self.k < 1:
            raise ValueError(f"eval mode {self.kind}: k must be >= 1, got {self.k}")

    @classmethod
    def from_config(cls, mode: EvalModeConfig) -> EvalMode:
        """From an ``EvalModeConfig`` (rlvr.config.eval), filling its defaults."""
        if mode.kind == "greedy":
            return cls("greedy")
        return cls(
            "sampling", k=mode.samples, temperature=mode.sampling_temperature, top_p=mode.top_p
        )

    def params(
        self, max_new_tokens: int, stop: tuple[str, ...] = (), seed: int = 0
    ) -> SamplingParams:
        if self.kind == "greedy":
            return SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens, stop=stop)
        return SamplingParams(
            n=self.k,
            temperature=self.temperature,
            top_p=self.top_p,
            max_new_tokens=max_new_tokens,
            stop=stop,
            seed=seed,
        )


def generate_records(
    engine,
    tokenizer,
    rows: list[dict],
    rewards,
    *,
    template: str,
    system_prompt: str | None,
    params: SamplingParams,
) -> list[dict]:
    """Per-problem records: prompt, reference, responses, extracted answers, correctness, scores."""
    texts, ids = render_rows(rows, template, tokenizer, system_prompt)
    groups = engine.generate(ids, params)
    flat_rows = [r for r, g in zip(rows, groups, strict=True) for _ in g]
    comps = [c for g in groups for c in g]
    scored = rewards.score_batch(
        [t for t, g in zip(texts, groups, strict=True) for _ in g],
        [c.text for c in comps],
        [r["answer"] for r in flat_rows],
        flat_rows,
        [c.truncated for c in comps],
    )
    records, k = [], 0
    for row, g in zip(rows, groups, strict=True):
        n = len(g)
        infos = scored.infos[k : k + n]
        scores = scored.scores[k : k + n]
        records.append(
            {
                "source": row.get("_source"),
                "prompt": row["prompt"],
                "reference": row["answer"],
                "responses": [c.text for c in g],
                "answers": [extract_answer(c.text)[0] for c in g],
                "correct": [
                    bool(i.get("correct", s >= 1.0)) and ok
                    for i, s, ok in zip(infos, scores, scored.valid[k : k + n], strict=True)
                ],
                "scores": [float(s) for s in scores],
                "finish_reasons": [c.finish_reason for c in g],
            }
        )
        k += n
    return records


def evaluate(
    engine,
    tokenizer,
    rows: list[dict],
    rewards,
    *,
    template: str,
    system_prompt: str | None,
    mode: EvalMode,
    max_new_tokens: int,
    stop: tuple[str, ...] = (),
    seed: int = 0,
) -> tuple[dict, list[dict]]:
    """Run one mode over ``rows``; returns (named scores, per-problem records)."""
    params = mode.params(max_new_tokens, stop, seed)
    records = generate_records(
        engine,
        tokenizer,
        rows,
        rewards,
        template=template,
        system_prompt=system_prompt,
        params=params,
    )
    if mode.kind == "greedy":
        return summarize(records, "greedy"), records
    return summarize(records, "sampling", k=mode.k), records


@dataclass(frozen=True)
class EvalSet:
    """A named list of problems (rows with "prompt" and "answer") and the modes run on it."""

    name: str
    rows: list[dict]
    modes: tuple[EvalMode, ...]


@dataclass
class EvalOutcome:
    """What one evaluation of several sets produced.

    results: set name -> {metric: value} (metric names carry the mode: greedy_pass@1, maj@8, ...)
    records: set name -> mode kind -> per-problem records (see `generate_records`)
    """

    results: dict[str, dict[str, float]] = field(default_factory=dict)
    records: dict[str, dict[str, list[dict]]] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """Scores as ``eval/<set>/<metric>`` for metrics.jsonl (problem counts stay in the file)."""
        return {
            f"eval/{name}/{metric}": value
            for name, scores in self.results.items()
            for metric, value in scores.items()
            if not metric.endswith("num_prompts")
        }


def evaluate_sets(
    engine,
    tokenizer,
    sets: list[EvalSet],
    rewards,
    *,
    template: str,
    system_prompt: str | None,
    max_new_tokens: int,
    stop: tuple[str, ...] = (),
    seed: int = 0,
) -> EvalOutcome:
    """Every mode of every set through `evaluate()`; the one entry point of both evaluators."""
    outcome = EvalOutcome()
    for eval_set in sets:
        if not eval_set.rows:
            raise ValueError(f"eval set {eval_set.name!r} has no rows")
        outcome.results[eval_set.name] = {}
        outcome.records[eval_set.name] = {}
        for mode in eval_set.modes:
            scores, records = evaluate(
                engine,
                tokenizer,
                eval_set.rows,
                rewards,
                template=template,
                system_prompt=system_prompt,
                mode=mode,
                max_new_tokens=max_new_tokens,
                stop=stop,
                seed=seed,
            )
            outcome.results[eval_set.name].update(scores)
            outcome.records[eval_set.name][mode.kind] = records
    return outcome


def eval_payload(outcome: EvalOutcome, **extra) -> dict:
    """The JSON both evaluators write: ``extra`` (step, model, ...), results, records."""
    return {**extra, "results": outcome.results, "records": outcome.records}


def write_eval_file(path: Path, payload: dict) -> Path:
    """Write ``payload`` as JSON atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(payload, indent=1))
    return path
