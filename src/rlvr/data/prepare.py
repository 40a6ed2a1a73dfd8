"""Data preparation: load -> filter -> dedupe -> split -> verify -> write, with a manifest.

The stages run in this order; each is a plain function over a list of rows, and
`run_prepare` logs and records how many rows each kept and dropped:

1. `keep_integer_answers`  answers that are a bare integer ("42", "-7"); off with answers="any"
2. `exclude_sources`       drop rows whose source field matches any regex (case-insensitive),
                           e.g. "AMC|AIME" so evaluation problems never reach training
3. `drop_short`            drop problems shorter than `min_chars` characters (after strip)
4. `dedupe`                keep the first row of each problem hash (see `normalize_problem`)
5. `split`                 deterministic named splits; `verify_disjoint` then checks that no
                           problem hash appears in two splits

Output folder: `<split>.jsonl` per split and `manifest.json` (counts per stage and split,
sha256 of each output file, seed, input path and hash, options).

Dedupe always runs: without it the same problem could land in two splits, and the
zero-overlap guarantee is the point of this pipeline.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlvr.data.loaders import load_rows_with_report
from rlvr.data.records import DataError

logger = logging.getLogger(__name__)

_SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_INTEGER = re.compile(r"-?\d+")
# Sentence punctuation that does not change which problem a text states. Each becomes a space
# (not nothing) so "3.5" stays apart from "35". Math symbols (+ - * / = < > ( ) [ ] { } ^ _ \ $)
# are kept: "x - 5" and "x 5" are different problems.
_SENTENCE_PUNCTUATION = re.compile(
    r"""[.,;:!?'"`\u2018\u2019\u201a\u201c\u201d\u201e\u00ab\u00bb]"""
)
_WHITESPACE = re.compile(r"\s+")


class PrepareConfig(BaseModel):
    """Options of `rlvr data prepare`; the CLI flags mirror these fields."""

    model_config = ConfigDict(extra="forbid")

    input: Path = Field(description="input file or datasets folder (see rlvr.data.loaders)")
    out: Path = Field(description="output folder for <split>.jsonl files and manifest.json")
    prompt_field: str = Field("prompt", min_length=1, description="field with the problem text")
    answer_field: str = Field("answer", min_length=1, description="field with the answer")
    input_split: str | None = Field(None, description="split to read from a DatasetDict folder")
    on_bad_row: Literal["error", "skip"] = "error"
    answers: Literal["integer", "any"] = Field(
        "integer", description="'integer' keeps only bare integer answers (clean exact match)"
    )
    source_field: str = Field("source", min_length=1, description="field the exclusions match")
    exclude_sources: list[str] = Field(
        default_factory=list, description="regexes; a row whose source matches any is dropped"
    )
    min_chars: int = Field(1, ge=0, description="drop problems shorter than this (after strip)")
    splits: dict[str, int | float] = Field(
        description="name -> row count (int >= 1) or fraction of the filtered rows (0 < f <= 1)"
    )
    seed: int = 0
    overwrite: bool = Field(False, description="replace existing output files")

    @field_validator("exclude_sources")
    @classmethod
    def _regexes_compile(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"exclude_sources: bad regex {pattern!r} ({err})") from None
        return patterns

    @field_validator("splits")
    @classmethod
    def _splits_are_valid(cls, splits: dict[str, int | float]) -> dict[str, int | float]:
        if not splits:
            raise ValueError("splits: give at least one split, e.g. {'train': 1000}")
        fraction_total = 0.0
        for name, size in splits.items():
            if not _SPLIT_NAME.fullmatch(name) or name == "manifest":
                raise ValueError(
                    f"splits: bad split name {name!r} (letters, digits, '_', '.', '-'; "
                    "not 'manifest')"
                )
            if isinstance(size, bool):
                raise ValueError(f"splits: size of {name!r} must be a number, got {size!r}")
            if isinstance(size, int):
                if size < 1:
                    raise ValueError(f"splits: count for {name!r} must be >= 1, got {size}")
            elif not (0.0 < size <= 1.0):
                raise ValueError(
                    f"splits: fraction for {name!r} must be in (0, 1], got {size} "
                    "(write a row count as an integer)"
                )
            else:
                fraction_total += size
        if fraction_total > 1.0 + 1e-9:
            raise ValueError(f"splits: fractions sum to {fraction_total:g}, more than 1")
        return splits


# --------------------------------------------------------------------------- hashing


def normalize_problem(text: str) -> str:
    """The text that `problem_hash` hashes, so trivially different copies of a problem match.

    Steps: Unicode NFKC (full-width digits, non-breaking spaces and ligatures become their
    plain forms); casefold (lowercase, also for non-ASCII); sentence punctuation
    `. , ; : ! ? ' " `` and typographic quotes each become a space; whitespace runs become one
    space; leading and trailing space is removed. Math symbols are kept.

    >>> normalize_problem("  What is  2+3?\\n")
    'what is 2+3'
    """
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _SENTENCE_PUNCTUATION.sub(" ", text)
    return _WHITESPACE.sub(" ", text).strip()


def problem_hash(text: str) -> str:
    """sha256 hex digest of `normalize_problem(text)` encoded as UTF-8."""
    return hashlib.sha256(normalize_problem(text).encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------- stages


def keep_integer_answers(rows: Sequence[dict]) -> list[dict]:
    """Keep rows whose `answer` is a bare integer: optional minus sign, digits only.

    "1,000", "3.0", "\\frac{1}{2}" and "x=3" are dropped: exact-match rewards need one
    unambiguous spelling of the answer.
    """
    return [row for row in rows if _INTEGER.fullmatch(row["answer"])]


def exclude_sources(
    rows: Sequence[dict], patterns: Sequence[str], source_field: str = "source"
) -> list[dict]:
    """Drop rows whose `source_field` matches any regex in `patterns` (re.search, ignore case).

    Rows without the field are kept. If no row at all has the field, the field name is
    probably wrong, so that raises DataError instead of silently excluding nothing.
    """
    if not patterns:
        return list(rows)
    if rows and not any(row.get(source_field) is not None for row in rows):
        present = ", ".join(repr(k) for k in rows[0] if not k.startswith("_"))
        raise DataError(
            f"exclude_sources: no row has the source field {source_field!r} "
            f"(fields of the first row: {present})"
        )
    compiled = [re.compile(pattern, re.IGNORECASE) for pattern in patterns]

    def excluded(row: dict) -> bool:
        source = row.get(source_field)
        return source is not None and any(rx.search(str(source)) for rx in compiled)

    return [row for row in rows if not excluded(row)]


def drop_short(rows: Sequence[dict], min_chars: int) -> list[dict]:
    """Drop rows whose `prompt`, stripped of surrounding whitespace, has fewer than `min_chars`
    characters (so an empty or blank prompt is always dropped when min_chars >= 1)."""
    return [row for row in rows if len(row["prompt"].strip()) >= min_chars]


def dedupe(rows: Sequence[dict]) -> list[dict]:
    """Keep the first row of each `problem_hash(prompt)`; every kept row gets a
    `problem_hash` field."""
    seen: set[str] = set()
    kept = []
    for row in rows:
        digest = problem_hash(row["prompt"])
        if digest not in seen:
            seen.add(digest)
            kept.append({**row, "problem_hash": digest})
    return kept


def resolve_split_sizes(sizes: Mapping[str, int | float], available: int) -> dict[str, int]:
    """Turn counts and fractions into row counts for `available` rows.

    A fraction f gives floor(f * available) rows. When every size is a fraction and they sum
    to 1, the rows lost to rounding go to the first split, so no row is left unassigned.
    Raises DataError when the splits ask for more rows than there are, or a split gets 0.
    """
    counts = {
        name: size if isinstance(size, int) else math.floor(size * available)
        for name, size in sizes.items()
    }
    all_fractions = all(isinstance(size, float) for size in sizes.values())
    if all_fractions and math.isclose(sum(sizes.values()), 1.0):
        first = next(iter(counts))
        counts[first] += available - sum(counts.values())
    for name, count in counts.items():
        if count < 1:
            raise DataError(
                f"split {name!r} gets 0 rows ({sizes[name]} of {available} rows); "
                "give it a larger share or a row count"
            )
    if sum(counts.values()) > available:
        asked = ", ".join(f"{name}={count}" for name, count in counts.items())
        raise DataError(
            f"splits ask for {sum(counts.values())} rows ({asked}) but only {available} "
            "remain after filtering"
        )
    return counts


def split_rows(
    rows: Sequence[dict], sizes: Mapping[str, int | float], seed: int
) -> tuple[dict[str, list[dict]], int]:
    """Assign rows to named splits, deterministically for a seed; return (splits, unassigned).

    Rows are first sorted by problem hash, so the result depends on the set of problems and
    the seed, not on the input order; then shuffled with `random.Random(seed)` and cut into
    consecutive slices in the order `sizes` lists the splits. Pass deduplicated rows: copies of
    one problem could otherwise land in two splits (`verify_disjoint` would catch it).
    """
    counts = resolve_split_sizes(sizes, len(rows))
    ordered = sorted(rows, key=lambda row: problem_hash(row["prompt"]))
    random.Random(seed).shuffle(ordered)
    splits: dict[str, list[dict]] = {}
    start = 0
    for name, count in counts.items():
        splits[name] = ordered[start : start + count]
        start += count
    return splits, len(ordered) - start


def verify_disjoint(splits: Mapping[str, Sequence[Mapping]]) -> None:
    """Raise DataError if any problem hash (recomputed from `prompt`) is in two splits.

    The message names each overlapping hash (up to five) and the two splits it is in.
    """
    owner: dict[str, str] = {}
    overlaps: list[tuple[str, str, str]] = []
    for name, rows in splits.items():
        for digest in {problem_hash(row["prompt"]) for row in rows}:
            if digest in owner:
                overlaps.append((digest, owner[digest], name))
            else:
                owner[digest] = name
    if overlaps:
        shown = "; ".join(f"hash {d} in {a!r} and {b!r}" for d, a, b in overlaps[:5])
        more = f" (and {len(overlaps) - 5} more)" if len(overlaps) > 5 else ""
        raise DataError(f"splits overlap on {len(overlaps)} problem(s): {shown}{more}")


# --------------------------------------------------------------------------- pipeline


def run_prepare(cfg: PrepareConfig) -> dict:
    """Run the whole pipeline for `cfg`, write the split files and manifest; return the manifest."""
    targets = [cfg.out / f"{name}.jsonl" for name in cfg.splits] + [cfg.out / "manifest.json"]
    existing = [str(path) for path in targets if path.exists()]
    if existing and not cfg.overwrite:
        raise DataError(f"output files exist: {', '.join(existing)} (pass overwrite to replace)")

    rows, report = load_rows_with_report(
        cfg.input,
        prompt_field=cfg.prompt_field,
        answer_field=cfg.answer_field,
        on_bad_row=cfg.on_bad_row,
        split=cfg.input_split,
    )
    logger.info(report.summary())
    stages = [
        {
            "name": "load",
            "kept": report.rows_kept,
            "dropped": len(report.skipped),
            "dropped_by_kind": report.skipped_by_kind,
        }
    ]

    steps: list[tuple[str, Callable[[list[dict]], list[dict]]]] = []
    if cfg.answers == "integer":
        steps.append(("keep_integer_answers", keep_integer_answers))
    if cfg.exclude_sources:
        steps.append(
            (
                "exclude_sources",
                lambda r: exclude_sources(r, cfg.exclude_sources, cfg.source_field),
            )
        )
    steps.append(("drop_short", lambda r: drop_short(r, cfg.min_chars)))
    steps.append(("dedupe", dedupe))
    for name, step in steps:
        before = len(rows)
        rows = step(rows)
        stages.append({"name": name, "kept": len(rows), "dropped": before - len(rows)})
        logger.info("stage %s: kept %d, dropped %d", name, len(rows), before - len(rows))
    if not rows:
        raise DataError(f"{cfg.input}: no rows left after filtering ({_stage_text(stages)})")

    splits, unassigned = split_rows(rows, cfg.splits, cfg.seed)
    stages.append({"name": "split", "kept": len(rows) - unassigned, "dropped": unassigned})
    logger.info("stage split: assigned %d, unassigned %d", len(rows) - unassigned, unassigned)
    verify_disjoint(splits)

    cfg.out.mkdir(parents=True, exist_ok=True)
    split_info = {}
    for name, split in splits.items():
        path = cfg.out / f"{name}.jsonl"
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in split)
        split_info[name] = {
            "file": path.name,
            "rows": len(split),
            "sha256": _write_atomic(path, text.encode("utf-8")),
        }

    manifest = {
        "created_by": "rlvr data prepare",
        "input": {"path": str(cfg.input.resolve()), "sha256": _input_sha256(cfg.input)},
        "seed": cfg.seed,
        "options": cfg.model_dump(mode="json"),
        "stages": stages,
        "splits": split_info,
        "unassigned": unassigned,
        "disjoint_verified": True,
        "problem_hash": "sha256 of rlvr.data.prepare.normalize_problem(prompt)",
    }
    manifest_text = json.dumps(manifest, indent=2, ensure_ascii=False) + "\n"
    _write_atomic(cfg.out / "manifest.json", manifest_text.encode("utf-8"))
    return manifest


def _stage_text(stages: Sequence[Mapping]) -> str:
    return ", ".join(f"{s['name']}: kept {s['kept']} dropped {s['dropped']}" for s in stages)


def _write_atomic(path: Path, data: bytes) -> str:
    """Write `data` to a temporary sibling and rename it over `path`; return its sha256."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return hashlib.sha256(data).hexdigest()


def _input_sha256(path: Path) -> str:
    """sha256 of the input file; for a folder, over each file's relative path and bytes in
    sorted order (so it changes when any file is added, renamed or edited)."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            # Name and size first, so bytes cannot shift from one file to the next unnoticed.
            header = f"{file.relative_to(path).as_posix()}\0{file.stat().st_size}\0"
            digest.update(header.encode("utf-8"))
        with file.open("rb") as handle:
            for chunk in iter(lambda h=handle: h.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()
