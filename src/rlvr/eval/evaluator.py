"""Evaluation through exactly the code training uses: the same template, engine and reward runner.

Seed 001's evaluation took a different path from its rollouts and under-reported accuracy by
12.8 points; here `rlvr eval` and the in-training evaluator both call `evaluate()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.data.templates import render_prompt
from rlvr.eval.metrics import summarize
from rlvr.rewards.math import extract_answer
from rlvr.rollout.base import SamplingParams


@dataclass(frozen=True)
class EvalMode:
    """One named evaluation mode: ``greedy`` (temperature 0, n 1) or ``sampling`` (n = k)."""

    kind: str = "greedy"
    k: int = 1
    temperature: float = 1.0
    top_p: float = 1.0

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
    texts = [
        render_prompt(template, r["prompt"], tokenizer, r.get("system_prompt") or system_prompt)
        for r in rows
    ]
    ids = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
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
