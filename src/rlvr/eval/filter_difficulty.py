"""`rlvr data filter-difficulty`: keep the prompts the current model solves sometimes.

A prompt every sample solves (or none does) gives every completion of its group the same
reward, hence zero advantage: it costs a rollout and teaches nothing (hence filtering a
dataset to mixed outcomes). The model samples K responses per prompt through
the path training uses (template, rollout engine, reward runner: `generate_records`), and a
prompt is kept when its solve rate c / K lies strictly between ``min_rate`` and ``max_rate``.

Output: the kept rows (their original fields, plus ``solve_rate``) as JSONL, a summary
``<out>.summary.json`` and, on request, every prompt's records (responses, answers,
correctness) for inspection.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from rlvr import sandbox
from rlvr.config import load_config
from rlvr.data.loaders import load_rows
from rlvr.data.rows import reward_specs
from rlvr.eval.evaluator import generate_records
from rlvr.eval.loading import eval_engine, load_policy, resolve_source
from rlvr.rewards.runner import RewardRunner
from rlvr.rollout.base import SamplingParams


@dataclass(frozen=True)
class DifficultySummary:
    """Counts of one filtering pass. ``too_easy`` / ``too_hard`` are the rows dropped at or
    beyond ``max_rate`` / ``min_rate``; ``all_solved`` / ``none_solved`` count rates 1 and 0."""

    prompts: int
    k: int
    min_rate: float
    max_rate: float
    kept: int
    too_easy: int
    too_hard: int
    all_solved: int
    none_solved: int

    def line(self) -> str:
        return (
            f"kept {self.kept} of {self.prompts} prompts ({self.min_rate:g} < solve rate < "
            f"{self.max_rate:g} over k={self.k}); dropped {self.too_easy} too easy "
            f"({self.all_solved} all solved) and {self.too_hard} too hard "
            f"({self.none_solved} none solved)"
        )


def check_bounds(k: int, min_rate: float, max_rate: float) -> None:
    """ValueError naming the flag when the bounds or k cannot select anything sensible."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ValueError(f"--k must be an integer >= 2 (a solve rate needs 2+ samples), got {k!r}")
    if not 0.0 <= min_rate < max_rate <= 1.0:
        raise ValueError(
            f"--min-rate {min_rate} and --max-rate {max_rate}: need 0 <= min-rate < max-rate <= 1"
        )


def solve_rates(records: list[dict]) -> list[float]:
    """Fraction of correct responses of each record (``correct`` holds one bool per sample)."""
    rates = []
    for index, record in enumerate(records):
        correct = record["correct"]
        if not correct:
            raise ValueError(f"record {index} has no responses")
        rates.append(sum(bool(c) for c in correct) / len(correct))
    return rates


def split_by_difficulty(
    rows: list[dict], rates: list[float], *, k: int, min_rate: float, max_rate: float
) -> tuple[list[dict], DifficultySummary]:
    """Rows with ``min_rate < rate < max_rate`` (each with its ``solve_rate``), and the counts."""
    check_bounds(k, min_rate, max_rate)
    if len(rows) != len(rates):
        raise ValueError(f"{len(rows)} rows but {len(rates)} solve rates")
    kept = [
        {**row, "solve_rate": rate}
        for row, rate in zip(rows, rates, strict=True)
        if min_rate < rate < max_rate
    ]
    summary = DifficultySummary(
        prompts=len(rows),
        k=k,
        min_rate=min_rate,
        max_rate=max_rate,
        kept=len(kept),
        too_easy=sum(rate >= max_rate for rate in rates),
        too_hard=sum(rate <= min_rate for rate in rates),
        all_solved=sum(rate == 1.0 for rate in rates),
        none_solved=sum(rate == 0.0 for rate in rates),
    )
    return kept, summary


def filter_difficulty(
    engine,
    tokenizer,
    rows: list[dict],
    rewards,
    *,
    params: SamplingParams,
    template: str,
    system_prompt: str | None,
    min_rate: float = 0.0,
    max_rate: float = 1.0,
    processor=None,
) -> tuple[list[dict], DifficultySummary, list[dict]]:
    """Sample ``params.n`` responses per row; returns (kept rows, summary, per-prompt records).
    ``processor``: a vision-language model's, for rows with images."""
    check_bounds(params.n, min_rate, max_rate)
    if params.temperature <= 0:
        raise ValueError("difficulty filtering needs sampling: temperature must be > 0")
    records = generate_records(
        engine,
        tokenizer,
        rows,
        rewards,
        template=template,
        system_prompt=system_prompt,
        params=params,
        processor=processor,
    )
    kept, summary = split_by_difficulty(
        rows, solve_rates(records), k=params.n, min_rate=min_rate, max_rate=max_rate
    )
    return kept, summary, records


def write_kept(out: Path, kept: list[dict], summary: DifficultySummary) -> Path:
    """Kept rows as JSONL (loader bookkeeping keys like ``_source`` left out) and the summary
    as ``<out>.summary.json``; returns the summary's path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({k: v for k, v in row.items() if not k.startswith("_")}, ensure_ascii=False)
        for row in kept
    ]
    out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    summary_path = out.with_name(out.name + ".summary.json")
    summary_path.write_text(json.dumps(asdict(summary), indent=1))
    return summary_path


def cmd_filter_difficulty(args: argparse.Namespace) -> int:
    """Run `rlvr data filter-difficulty`; print the summary line. Returns the exit code."""

    check_bounds(args.k, args.min_rate, args.max_rate)  # before any model loads
    source = resolve_source(args.model)
    cfg_path = args.config or (source.run_dir / "config.yaml" if source.run_dir else None)
    cfg = load_config(cfg_path, args.overrides)
    rows = load_rows(
        args.data,
        prompt_field=cfg.data.prompt_field,
        answer_field=cfg.data.answer_field,
        system_prompt=cfg.data.system_prompt,
        answer_extract=cfg.data.answer_extract,
    )
    r = cfg.rollout
    params = SamplingParams(
        n=args.k,
        temperature=r.temperature if args.temperature is None else args.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_new_tokens=r.max_new_tokens,
        stop=tuple(r.stop),
        seed=cfg.train.seed if args.seed is None else args.seed,
    )
    model, tokenizer, _, processor = load_policy(
        source, cfg, base=args.base, config_given=bool(cfg_path)
    )
    engine = eval_engine(cfg, model, tokenizer)
    sandbox.configure(cfg.sandbox)  # the backend and limits of model-written code (rlvr.sandbox)
    rewards = RewardRunner(
        reward_specs(cfg), timeout_s=cfg.reward.timeout_s, max_failure_fraction=1.0
    )
    try:
        kept, summary, records = filter_difficulty(
            engine,
            tokenizer,
            rows,
            rewards,
            params=params,
            template=cfg.data.template,
            system_prompt=cfg.data.system_prompt,
            min_rate=args.min_rate,
            max_rate=args.max_rate,
            processor=processor,
        )
    finally:
        rewards.close()
        engine.close()
    summary_path = write_kept(Path(args.out), kept, summary)
    if args.records:
        Path(args.records).write_text(json.dumps(records, indent=1))
    print(summary.line())
    print(f"kept rows: {args.out}; summary: {summary_path}")
    return 0
