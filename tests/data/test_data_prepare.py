"""rlvr.data.prepare: each stage on a small table, splits, overlap check, manifest."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rlvr.data.loaders import DataError, load_rows
from rlvr.data.prepare import (
    PrepareConfig,
    dedupe,
    drop_short,
    exclude_sources,
    keep_integer_answers,
    normalize_problem,
    problem_hash,
    resolve_split_sizes,
    run_prepare,
    split_rows,
    verify_disjoint,
)


def row(prompt: str, answer: str = "1", **extra: object) -> dict:
    return {"prompt": prompt, "answer": answer, **extra}


# --------------------------------------------------------------------------- hashing


def test_normalize_problem_ignores_case_space_and_sentence_punctuation() -> None:
    assert normalize_problem("  What is\t2+3?\n") == "what is 2+3"
    assert normalize_problem("WHAT IS 2+3") == "what is 2+3"
    assert normalize_problem("“What,” she asked, “is 2+3?”") == "what she asked is 2+3"
    # NFKC: full-width digits and a non-breaking space become plain ones
    assert normalize_problem("Find ３\u00a0+ 4.") == "find 3 + 4"


def test_normalize_problem_keeps_what_changes_the_problem() -> None:
    # a decimal point becomes a space, so 3.5 and 35 stay different
    assert problem_hash("What is 3.5 * 2?") != problem_hash("What is 35 * 2?")
    # minus and brackets are maths, not punctuation
    assert problem_hash("Solve x - 5 = 0") != problem_hash("Solve x 5 = 0")
    assert problem_hash("(a+b)^2") != problem_hash("a+b^2")


def test_problem_hash_is_sha256_of_the_normalised_text() -> None:
    expected = hashlib.sha256(b"what is 2+3").hexdigest()
    assert problem_hash("What is 2+3?") == expected


# --------------------------------------------------------------------------- stages


def test_keep_integer_answers() -> None:
    rows = [row("a", a) for a in ["42", "-7", "007", "1,000", "3.0", "\\frac{1}{2}", "x=3", "+5"]]
    kept = keep_integer_answers(rows)
    assert [r["answer"] for r in kept] == ["42", "-7", "007"]


def test_exclude_sources_is_case_insensitive_search() -> None:
    rows = [
        row("p1", source="amc_aime"),
        row("p2", source="olympiads"),
        row("p3", source="AIME 2024"),
        row("p4", source="cn_k12"),
        row("p5"),  # no source: kept
        row("p6", source="Amc12"),
    ]
    kept = exclude_sources(rows, ["AMC|AIME"])
    assert [r["prompt"] for r in kept] == ["p2", "p4", "p5"]
    # several patterns: any match excludes
    kept = exclude_sources(rows, ["^olymp", "k12$"], source_field="source")
    assert [r["prompt"] for r in kept] == ["p1", "p3", "p5", "p6"]
    assert exclude_sources(rows, []) == rows


def test_exclude_sources_with_a_field_no_row_has_is_an_error() -> None:
    rows = [row("p1", origin="amc"), row("p2", origin="gsm8k")]
    with pytest.raises(DataError, match=r"no row has the source field 'source' .*'origin'"):
        exclude_sources(rows, ["AMC"])


def test_drop_short_strips_before_counting() -> None:
    rows = [row("abcd"), row("  abc  "), row("ab"), row("   ")]
    assert [r["prompt"] for r in drop_short(rows, 3)] == ["abcd", "  abc  "]
    assert [r["prompt"] for r in drop_short(rows, 1)] == ["abcd", "  abc  ", "ab"]


def test_dedupe_keeps_first_and_adds_hash() -> None:
    rows = [
        row("What is 2+3?", "5", id=1),
        row("what is 2+3", "5", id=2),  # same problem after normalisation
        row("What is 2+4?", "6", id=3),
        row("WHAT  IS 2+3 ?", "5", id=4),  # same again
    ]
    kept = dedupe(rows)
    assert [r["id"] for r in kept] == [1, 3]
    assert kept[0]["problem_hash"] == hashlib.sha256(b"what is 2+3").hexdigest()


# --------------------------------------------------------------------------- splits


def test_resolve_split_sizes_by_hand() -> None:
    # 11 rows, 0.8/0.2: floor(8.8) = 8, floor(2.2) = 2; 11 - 10 = 1 leftover goes to the first
    assert resolve_split_sizes({"train": 0.8, "test": 0.2}, 11) == {"train": 9, "test": 2}
    # fractions summing below 1 leave rows out: floor(0.5 * 11) = 5, floor(0.25 * 11) = 2
    assert resolve_split_sizes({"train": 0.5, "test": 0.25}, 11) == {"train": 5, "test": 2}
    # counts and fractions mixed: test = floor(0.3 * 10) = 3
    assert resolve_split_sizes({"train": 5, "test": 0.3}, 10) == {"train": 5, "test": 3}
    with pytest.raises(DataError, match=r"ask for 12 rows \(train=10, test=2\) but only 11"):
        resolve_split_sizes({"train": 10, "test": 2}, 11)
    with pytest.raises(DataError, match=r"split 'test' gets 0 rows"):
        resolve_split_sizes({"train": 5, "test": 0.05}, 10)


def unique_rows(count: int) -> list[dict]:
    return [row(f"Problem number {i}: what is {i} + {i}?", str(2 * i)) for i in range(count)]


def test_split_is_deterministic_by_seed_and_ignores_input_order() -> None:
    rows = unique_rows(60)
    first, left = split_rows(rows, {"train": 40, "test": 15}, seed=7)
    again, _ = split_rows(rows, {"train": 40, "test": 15}, seed=7)
    shuffled = rows[:]
    random.Random(3).shuffle(shuffled)
    reordered, _ = split_rows(shuffled, {"train": 40, "test": 15}, seed=7)
    other, _ = split_rows(rows, {"train": 40, "test": 15}, seed=8)

    def prompts(splits: dict) -> dict:
        return {name: [r["prompt"] for r in rs] for name, rs in splits.items()}

    assert left == 5  # 60 - 40 - 15
    assert {k: len(v) for k, v in first.items()} == {"train": 40, "test": 15}
    assert prompts(first) == prompts(again) == prompts(reordered)
    # another seed gives another test set (the chance of the same 15 of 60 is ~1e-14)
    assert set(prompts(other)["test"]) != set(prompts(first)["test"])


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(st.text(min_size=1, max_size=12), min_size=2, max_size=40),
    train_share=st.floats(min_value=0.1, max_value=0.6),
    seed=st.integers(0, 2**32),
)
def test_split_of_deduped_rows_is_disjoint_and_sized(
    prompts: list[str], train_share: float, seed: int
) -> None:
    rows = dedupe([row(p) for p in prompts])
    sizes = {"train": train_share, "test": 1 - train_share}  # sums to 1: nothing left over
    if any(int(share * len(rows)) < 1 for share in sizes.values()):
        return  # too few rows for two non-empty splits; resolve_split_sizes rejects that
    splits, unassigned = split_rows(rows, sizes, seed)
    verify_disjoint(splits)  # raises if any problem is in both
    assert unassigned == 0
    assert len(splits["train"]) + len(splits["test"]) == len(rows)
    kept = sorted(r["problem_hash"] for r in rows)
    assert sorted(r["problem_hash"] for s in splits.values() for r in s) == kept


def test_verify_disjoint_names_hash_and_splits() -> None:
    train = [row("What is 1+1?"), row("What is 2+2?")]
    test = [row("what is 2+2"), row("What is 3+3?")]  # same problem as train[1]
    with pytest.raises(DataError) as err:
        verify_disjoint({"train": train, "test": test})
    message = str(err.value)
    assert "overlap on 1 problem" in message
    assert hashlib.sha256(b"what is 2+2").hexdigest() in message
    assert "'train' and 'test'" in message
    verify_disjoint({"train": train[:1], "test": test})  # no overlap: no error


# --------------------------------------------------------------------------- config


def test_config_rejects_unknown_keys_and_bad_values(tmp_path: Path) -> None:
    base = {"input": tmp_path / "in.jsonl", "out": tmp_path / "out", "splits": {"train": 10}}
    with pytest.raises(ValidationError, match="seeed"):
        PrepareConfig(**base, seeed=1)
    with pytest.raises(ValidationError, match=r"bad regex '\(AMC'"):
        PrepareConfig(**base, exclude_sources=["(AMC"])
    with pytest.raises(ValidationError, match="fractions sum to 1.1, more than 1"):
        PrepareConfig(**{**base, "splits": {"train": 0.8, "test": 0.3}})
    with pytest.raises(ValidationError, match=r"fraction for 'train' must be in \(0, 1\]"):
        PrepareConfig(**{**base, "splits": {"train": 1.5}})
    with pytest.raises(ValidationError, match="bad split name 'manifest'"):
        PrepareConfig(**{**base, "splits": {"manifest": 3}})
    with pytest.raises(ValidationError, match="answers"):
        PrepareConfig(**base, answers="integers")


# --------------------------------------------------------------------------- end to end


def write_input(path: Path) -> Path:
    lines = [
        {"problem": "What is 10 + 32?", "answer": "42", "source": "gsm8k"},  # kept
        {"problem": "what is 10 + 32", "answer": "42", "source": "gsm8k"},  # dup of line 1
        {"problem": "AIME: find n such that n^2 = 49", "answer": "7", "source": "aime_2024"},
        {"problem": "Compute 3/4 of 1", "answer": "0.75", "source": "math"},  # not integer
        {"problem": "Hi?", "answer": "1", "source": "synthetic"},  # 3 chars: too short
    ]
    lines += [
        {"problem": f"How many apples are in {i} bags of {i} apples?", "answer": str(i * i)}
        for i in range(1, 11)
    ]  # 10 more distinct integer problems, no source field
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


def make_cfg(tmp_path: Path, **overrides: object) -> PrepareConfig:
    options = {
        "input": write_input(tmp_path / "raw.jsonl"),
        "out": tmp_path / "out",
        "prompt_field": "problem",
        "exclude_sources": ["AMC|AIME"],
        "min_chars": 5,
        "splits": {"train": 7, "test": 3},
        "seed": 11,
    }
    return PrepareConfig(**{**options, **overrides})


def test_run_prepare_end_to_end(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    manifest = run_prepare(cfg)

    # 15 rows: 0.75 is not an integer (-1 -> 14), the AIME row is excluded (-1 -> 13),
    # "Hi?" has 3 < 5 characters (-1 -> 12), line 2 duplicates line 1 (-1 -> 11);
    # the splits take 7 + 3 = 10 of the 11, leaving 1 unassigned.
    assert [(s["name"], s["kept"], s["dropped"]) for s in manifest["stages"]] == [
        ("load", 15, 0),
        ("keep_integer_answers", 14, 1),
        ("exclude_sources", 13, 1),
        ("drop_short", 12, 1),
        ("dedupe", 11, 1),
        ("split", 10, 1),
    ]
    assert manifest["unassigned"] == 1
    assert manifest["seed"] == 11
    assert manifest["input"]["path"] == str(cfg.input.resolve())
    assert manifest["input"]["sha256"] == hashlib.sha256(cfg.input.read_bytes()).hexdigest()
    assert manifest["options"]["exclude_sources"] == ["AMC|AIME"]

    on_disk = json.loads((cfg.out / "manifest.json").read_text())
    assert on_disk == manifest
    for name, expected_rows in (("train", 7), ("test", 3)):
        info = manifest["splits"][name]
        data = (cfg.out / info["file"]).read_bytes()
        assert info["sha256"] == hashlib.sha256(data).hexdigest()
        assert info["rows"] == expected_rows
        rows = load_rows(cfg.out / info["file"])  # outputs read back through the loader
        assert len(rows) == expected_rows
        assert all(r["problem_hash"] == problem_hash(r["prompt"]) for r in rows)
        assert not any("AIME" in r["prompt"] or r["answer"] == "0.75" for r in rows)
    train = load_rows(cfg.out / "train.jsonl")
    test = load_rows(cfg.out / "test.jsonl")
    verify_disjoint({"train": train, "test": test})


def test_run_prepare_refuses_to_overwrite_and_is_reproducible(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    first = run_prepare(cfg)
    train_bytes = (cfg.out / "train.jsonl").read_bytes()
    with pytest.raises(DataError, match=r"output files exist: .*train\.jsonl"):
        run_prepare(cfg)
    second = run_prepare(cfg.model_copy(update={"overwrite": True}))
    assert (cfg.out / "train.jsonl").read_bytes() == train_bytes
    assert second["splits"] == first["splits"]


def test_any_answer_keeps_non_integer_answers(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, answers="any", splits={"train": 1.0})
    manifest = run_prepare(cfg)
    # no integer stage; 15 -> 14 (AIME) -> 13 ("Hi?") -> 12 (duplicate); 1.0 takes all 12
    assert [s["name"] for s in manifest["stages"]] == [
        "load",
        "exclude_sources",
        "drop_short",
        "dedupe",
        "split",
    ]
    assert manifest["splits"]["train"]["rows"] == 12
    answers = {r["answer"] for r in load_rows(cfg.out / "train.jsonl")}
    assert "0.75" in answers


def test_run_prepare_with_too_few_rows_says_how_many_remain(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, splits={"train": 10, "test": 5})
    with pytest.raises(DataError, match=r"ask for 15 rows .* but only 11 remain"):
        run_prepare(cfg)
    assert not (cfg.out / "manifest.json").exists()
