"""`rlvr data filter-difficulty`: solve rates, strict bounds, output files, and a tiny-model run."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from difficulty_rewards import coin
from hypothesis import given
from hypothesis import strategies as st

from rlvr.cli.main import main
from rlvr.data.loaders import load_rows
from rlvr.eval.filter_difficulty import (
    DifficultySummary,
    check_bounds,
    solve_rates,
    split_by_difficulty,
    write_kept,
)

T, F = True, False
# Six prompts, k = 4 samples each; solve rates 0, 1/4, 2/4, 3/4, 1, 1.
RECORDS = [
    {"correct": [F, F, F, F]},
    {"correct": [T, F, F, F]},
    {"correct": [T, T, F, F]},
    {"correct": [F, T, T, T]},
    {"correct": [T, T, T, T]},
    {"correct": [T, T, T, T]},
]
ROWS = [{"prompt": f"p{i}", "answer": str(i), "_source": f"f:{i + 1}"} for i in range(6)]


def test_solve_rates_are_fractions_of_correct_samples() -> None:
    assert solve_rates(RECORDS) == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]


def test_default_bounds_keep_mixed_outcomes_only() -> None:
    kept, summary = split_by_difficulty(ROWS, solve_rates(RECORDS), k=4, min_rate=0.0, max_rate=1.0)
    # 0 < rate < 1: p1 (1/4), p2 (2/4), p3 (3/4); dropped: p4, p5 all solved, p0 none solved
    assert [(r["prompt"], r["solve_rate"]) for r in kept] == [
        ("p1", 0.25),
        ("p2", 0.5),
        ("p3", 0.75),
    ]
    assert kept[0]["answer"] == "1" and kept[0]["_source"] == "f:2"  # fields travel along
    assert summary == DifficultySummary(
        prompts=6,
        k=4,
        min_rate=0.0,
        max_rate=1.0,
        kept=3,
        too_easy=2,
        too_hard=1,
        all_solved=2,
        none_solved=1,
    )
    assert summary.line() == (
        "kept 3 of 6 prompts (0 < solve rate < 1 over k=4); dropped 2 too easy "
        "(2 all solved) and 1 too hard (1 none solved)"
    )


def test_bounds_are_strict() -> None:
    kept, summary = split_by_difficulty(
        ROWS, solve_rates(RECORDS), k=4, min_rate=0.25, max_rate=0.75
    )
    # only 2/4 lies strictly inside (1/4, 3/4); 3/4, 1, 1 are too easy; 0, 1/4 too hard
    assert [r["prompt"] for r in kept] == ["p2"]
    assert (summary.too_easy, summary.all_solved) == (3, 2)
    assert (summary.too_hard, summary.none_solved) == (2, 1)


@pytest.mark.parametrize(
    "k, low, high, message",
    [
        (1, 0.0, 1.0, "--k must be an integer >= 2"),
        (8, 0.5, 0.5, "need 0 <= min-rate < max-rate <= 1"),
        (8, -0.1, 1.0, "--min-rate -0.1"),
        (8, 0.0, 1.5, "--max-rate 1.5"),
    ],
)
def test_bad_bounds_name_the_flag(k: int, low: float, high: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_bounds(k, low, high)


@given(
    st.lists(st.lists(st.booleans(), min_size=4, max_size=4), min_size=1, max_size=30),
    st.sampled_from([0.0, 0.25, 0.5]),
    st.sampled_from([0.5, 0.75, 1.0]),
)
def test_every_prompt_is_kept_or_dropped_exactly_once(
    correct: list[list[bool]], low: float, high: float
) -> None:
    if low >= high:
        return
    rows = [{"prompt": str(i), "answer": ""} for i in range(len(correct))]
    rates = solve_rates([{"correct": c} for c in correct])
    kept, summary = split_by_difficulty(rows, rates, k=4, min_rate=low, max_rate=high)
    assert summary.kept + summary.too_easy + summary.too_hard == len(rows)
    assert all(low < r["solve_rate"] < high for r in kept)
    assert summary.all_solved == sum(all(c) for c in correct)
    assert summary.none_solved == sum(not any(c) for c in correct)


def test_written_rows_reload_as_a_dataset(tmp_path: Path) -> None:
    kept, summary = split_by_difficulty(ROWS, solve_rates(RECORDS), k=4, min_rate=0.0, max_rate=1.0)
    out = tmp_path / "kept.jsonl"
    summary_path = write_kept(out, kept, summary)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0] == {"prompt": "p1", "answer": "1", "solve_rate": 0.25}  # no _source
    assert [r["prompt"] for r in load_rows(out)] == ["p1", "p2", "p3"]
    assert summary_path == tmp_path / "kept.jsonl.summary.json"
    assert json.loads(summary_path.read_text()) == asdict(summary)


def expected_correct(solve: str, response: str) -> bool:
    return {"always": True, "never": False}.get(solve, coin(response))


def test_filter_difficulty_on_a_tiny_model(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rows choose their own outcome through the toy reward: `always`, `never`, or a coin
    flipped by each sampled response. Only rows with mixed outcomes may be kept."""
    kinds = ["always", "never", "coin"] * 3
    data = tmp_path / "rows.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": f"What is {i} + {i}?", "answer": str(2 * i), "solve": kind})
            + "\n"
            for i, kind in enumerate(kinds)
        )
    )
    out, records_path = tmp_path / "kept.jsonl", tmp_path / "records.json"
    code = main(
        [
            "data",
            "filter-difficulty",
            f"--model={tiny_model_dir}",
            f"--data={data}",
            "--k=16",
            f"--out={out}",
            f"--records={records_path}",
            "data.template=none",
            "rollout.max_new_tokens=8",
            "train.threads=1",
            "reward.specs=[{name: 'difficulty_rewards:by_row'}]",
        ]
    )
    assert code == 0
    records = json.loads(records_path.read_text())
    assert [len(r["responses"]) for r in records] == [16] * 9
    # the grades are the toy rule applied to the sampled responses...
    rates = []
    for kind, record in zip(kinds, records, strict=True):
        assert record["correct"] == [expected_correct(kind, t) for t in record["responses"]]
        rates.append(sum(record["correct"]) / 16)
    # ...and the kept rows are exactly those with 0 < rate < 1, with their rates
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    expected = [(f"What is {i} + {i}?", rate) for i, rate in enumerate(rates) if 0.0 < rate < 1.0]
    assert [(r["prompt"], r["solve_rate"]) for r in kept] == expected
    assert all(r["solve"] == "coin" for r in kept)
    assert len(kept) >= 1  # 16 coin flips of distinct responses are almost never all equal
    summary = json.loads((tmp_path / "kept.jsonl.summary.json").read_text())
    assert (summary["all_solved"], summary["none_solved"]) == (
        sum(r == 1.0 for r in rates),
        sum(r == 0.0 for r in rates),
    )
    assert summary["kept"] + summary["too_easy"] + summary["too_hard"] == 9
    assert f"kept {len(kept)} of 9 prompts" in capsys.readouterr().out


def test_filter_difficulty_bad_input_stops_before_loading_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["data", "filter-difficulty", "--model=/no/model", f"--out={tmp_path}/k.jsonl"]
    assert main([*base, f"--data={tmp_path}/rows.jsonl", "--k=1"]) == 2
    assert "--k must be an integer >= 2" in capsys.readouterr().err
    assert main([*base, f"--data={tmp_path}/missing.jsonl"]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "k.jsonl").exists()
