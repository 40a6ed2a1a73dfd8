"""rlvr.data.loaders on small files written by each test."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rlvr.data.loaders import DataError, load_rows, load_rows_with_report


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------------- each format


def test_jsonl_rows_keep_fields_and_normalise(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "math.jsonl",
        [
            '{"input": "What is 2+3?", "label": 5, "source": "gsm8k"}',
            "",  # blank lines are allowed and still count as lines
            '{"input": "Half of 3?", "label": 1.5}',
            '{"input": "Ten?", "label": 10.0}',
        ],
    )
    rows = load_rows(path, prompt_field="input", answer_field="label", system_prompt="Be brief.")
    assert [r["prompt"] for r in rows] == ["What is 2+3?", "Half of 3?", "Ten?"]
    # int 5 -> "5"; float 1.5 -> "1.5"; an integral float 10.0 -> "10" (not "10.0")
    assert [r["answer"] for r in rows] == ["5", "1.5", "10"]
    assert rows[0]["source"] == "gsm8k" and rows[0]["label"] == 5  # originals kept
    assert all(r["system_prompt"] == "Be brief." for r in rows)
    # 1-based line numbers; line 2 is the blank line
    assert [r["_source"] for r in rows] == ["math.jsonl:1", "math.jsonl:3", "math.jsonl:4"]


def test_no_system_prompt_key_unless_given(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", ['{"prompt": "p?", "answer": " 7 "}'])
    (row,) = load_rows(path)
    assert "system_prompt" not in row
    assert row["answer"] == "7"  # surrounding whitespace stripped


def test_json_list_uses_row_index(tmp_path: Path) -> None:
    path = tmp_path / "set.json"
    path.write_text(json.dumps([{"prompt": "a?", "answer": "1"}, {"prompt": "b?", "answer": 2}]))
    rows = load_rows(path)
    assert [(r["prompt"], r["answer"], r["_source"]) for r in rows] == [
        ("a?", "1", "set.json:0"),
        ("b?", "2", "set.json:1"),
    ]


def test_json_that_is_not_a_list_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "obj.json"
    path.write_text('{"prompt": "a?", "answer": "1"}')
    with pytest.raises(DataError, match=r"obj\.json.*list of objects.*got dict"):
        load_rows(path)


def test_csv_line_numbers_count_the_header_and_multiline_fields(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    # line 1 header; line 2 row; lines 3-4 one row with a quoted newline; line 5 row
    path.write_text('prompt,answer\nOne?,1\n"Two\nlines?",2\nThree?,3\n', encoding="utf-8")
    rows = load_rows(path)
    assert [r["prompt"] for r in rows] == ["One?", "Two\nlines?", "Three?"]
    assert [r["_source"] for r in rows] == ["t.csv:2", "t.csv:3", "t.csv:5"]


def test_csv_row_with_wrong_field_count_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("prompt,answer\nOne?,1\nTwo?,2,extra\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"t\.csv line 3: has 3 fields but the header has 2"):
        load_rows(path)


def test_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    table = pa.table({"problem": ["x?", "y?", "z?"], "answer": [4, 5, 6]})
    pq.write_table(table, path)
    rows = load_rows(path, prompt_field="problem")
    assert [(r["prompt"], r["answer"], r["_source"]) for r in rows] == [
        ("x?", "4", "p.parquet:0"),
        ("y?", "5", "p.parquet:1"),
        ("z?", "6", "p.parquet:2"),
    ]


def test_parquet_bad_row_names_row_index(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"prompt": ["ok?", None], "answer": ["1", "2"]}), path)
    with pytest.raises(DataError, match=r"p\.parquet row 1: prompt field 'prompt' is null"):
        load_rows(path)


def test_save_to_disk_dataset_and_dataset_dict(tmp_path: Path) -> None:
    import datasets

    ds = datasets.Dataset.from_list([{"q": "a?", "a": 1}, {"q": "b?", "a": 2}])
    ds.save_to_disk(str(tmp_path / "single"))
    rows = load_rows(tmp_path / "single", prompt_field="q", answer_field="a")
    assert [(r["prompt"], r["answer"], r["_source"]) for r in rows] == [
        ("a?", "1", "single:0"),
        ("b?", "2", "single:1"),
    ]

    test = datasets.Dataset.from_list([{"q": "c?", "a": 3}])
    datasets.DatasetDict({"train": ds, "test": test}).save_to_disk(str(tmp_path / "dd"))
    rows = load_rows(tmp_path / "dd", prompt_field="q", answer_field="a", split="test")
    assert [(r["prompt"], r["answer"], r["_source"]) for r in rows] == [("c?", "3", "dd/test:0")]
    with pytest.raises(DataError, match=r"several splits: pass split= .*\(one of: test, train\)"):
        load_rows(tmp_path / "dd", prompt_field="q", answer_field="a")
    with pytest.raises(DataError, match=r"unknown split 'dev'; known: test, train"):
        load_rows(tmp_path / "dd", prompt_field="q", answer_field="a", split="dev")


def test_folder_that_is_not_a_dataset(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    with pytest.raises(DataError, match=r"plain: cannot be read .*doesn't contain any data files"):
        load_rows(tmp_path / "plain")


# --------------------------------------------------------------------------- bad input


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope\.jsonl: no such file"):
        load_rows(tmp_path / "nope.jsonl")


def test_unknown_suffix_lists_known_formats(tmp_path: Path) -> None:
    path = tmp_path / "data.txt"
    path.write_text("hello")
    with pytest.raises(DataError, match=r"unknown format '\.txt'; known: \.jsonl, \.json, \.csv"):
        load_rows(path)


def test_bad_json_on_line_3(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "broken.jsonl",
        ['{"prompt": "a?", "answer": "1"}', '{"prompt": "b?", "answer": "2"}', '{"prompt": "c?",'],
    )
    with pytest.raises(DataError) as err:
        load_rows(path)
    assert "broken.jsonl" in str(err.value)
    assert "line 3" in str(err.value)
    assert "invalid JSON" in str(err.value)


def test_missing_prompt_field_names_field_and_fields_present(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "f.jsonl", ['{"question": "a?", "answer": "1", "id": 3}'])
    with pytest.raises(DataError) as err:
        load_rows(path)
    message = str(err.value)
    assert "f.jsonl line 1" in message
    assert "no prompt field 'prompt'" in message
    assert "fields present: 'question', 'answer', 'id'" in message


def test_missing_answer_field(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "f.jsonl", ['{"prompt": "a?", "solution": "1"}'])
    with pytest.raises(DataError, match=r"line 1: no answer field 'answer' \(fields present: "):
        load_rows(path)
    # ... unless answers are optional: then it becomes ""
    (row,) = load_rows(path, require_answer=False)
    assert row["answer"] == ""


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"prompt": "   ", "answer": "1"}', r"line 2: prompt field 'prompt' is empty"),
        (
            '{"prompt": 12, "answer": "1"}',
            r"line 2: prompt field 'prompt' must be a string, got int",
        ),
        ('{"prompt": "a?", "answer": ""}', r"line 2: answer field 'answer' is empty"),
        # a one-item list is its item (OlympiadBench final_answer); longer lists are not
        ('{"prompt": "a?", "answer": [1, 2]}', r"answer field 'answer' must be a string or number"),
        ('{"prompt": "a?", "answer": true}', r"answer field 'answer' .* got bool"),
        ('["a?", "1"]', r"line 2: expected an object, got list"),
    ],
)
def test_bad_values_name_line_and_field(tmp_path: Path, line: str, expected: str) -> None:
    path = write_jsonl(tmp_path / "v.jsonl", ['{"prompt": "ok?", "answer": "1"}', line])
    with pytest.raises(DataError, match=expected):
        load_rows(path)


def test_skip_mode_counts_and_summarises(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_jsonl(
        tmp_path / "mixed.jsonl",
        [
            '{"prompt": "a?", "answer": "1"}',  # 1 good
            '{"prompt": "b?", "answer": ',  # 2 invalid JSON
            '{"question": "c?", "answer": "3"}',  # 3 missing prompt
            '{"prompt": "d?", "answer": "4"}',  # 4 good
            '{"prompt": "", "answer": "5"}',  # 5 empty prompt
            '{"prompt": "f?"}',  # 6 missing answer
        ],
    )
    rows, report = load_rows_with_report(path, on_bad_row="skip")
    assert [r["_source"] for r in rows] == ["mixed.jsonl:1", "mixed.jsonl:4"]
    assert report.records_read == 6 and report.rows_kept == 2
    assert [bad.source for bad in report.skipped] == [
        "mixed.jsonl:2",
        "mixed.jsonl:3",
        "mixed.jsonl:5",
        "mixed.jsonl:6",
    ]
    assert report.skipped_by_kind == {"invalid_json": 1, "missing_field": 2, "empty_field": 1}
    summary = report.summary()
    assert "read 6 records, kept 2, skipped 4" in summary
    assert "first skipped:" in summary and "line 2" in summary

    with caplog.at_level(logging.INFO, logger="rlvr.data.loaders"):
        assert len(load_rows(path, on_bad_row="skip")) == 2
    assert any("skipped 4" in rec.getMessage() for rec in caplog.records)


def test_no_usable_rows_is_an_error(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", ['{"x": 1}', '{"x": 2}'])
    with pytest.raises(DataError, match=r"no usable rows .*skipped 2"):
        load_rows(path, on_bad_row="skip")


def test_limit_counts_good_rows(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "l.jsonl",
        ['{"prompt": "a?", "answer": "1"}', "{oops", '{"prompt": "b?", "answer": "2"}', "{}"],
    )
    rows, report = load_rows_with_report(path, on_bad_row="skip", limit=2)
    # the invalid line 2 is skipped, then reading stops at the second good row (line 3)
    assert [r["prompt"] for r in rows] == ["a?", "b?"]
    assert report.records_read == 3
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        load_rows(path, limit=0)


def test_bad_option_values() -> None:
    with pytest.raises(ValueError, match="on_bad_row must be 'error' or 'skip', got 'ignore'"):
        load_rows("x.jsonl", on_bad_row="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prompt_field must be a non-empty string"):
        load_rows("x.jsonl", prompt_field="")


def test_badly_encoded_line_is_one_bad_record(tmp_path: Path) -> None:
    path = tmp_path / "enc.jsonl"
    path.write_bytes(
        b'{"prompt": "a?", "answer": "1"}\n{"prompt": "caf\xe9?", "answer": "2"}\n'
        b'{"prompt": "b?", "answer": "3"}\n'
    )
    with pytest.raises(DataError, match=r"enc\.jsonl line 2: not UTF-8 text"):
        load_rows(path)
    rows, report = load_rows_with_report(path, on_bad_row="skip")
    assert [r["prompt"] for r in rows] == ["a?", "b?"]
    assert report.skipped_by_kind == {"invalid_utf8": 1}


def test_csv_header_with_a_repeated_column(tmp_path: Path) -> None:
    path = tmp_path / "dup.csv"
    path.write_text("prompt,answer,answer\nq?,1,2\n", encoding="utf-8")
    with pytest.raises(
        DataError, match=r"dup\.csv line 1: the header repeats column\(s\) \['answer'\]"
    ):
        load_rows(path)


def test_csv_byte_order_mark_is_not_part_of_the_first_column(tmp_path: Path) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes("\ufeffprompt,answer\nq?,4\n".encode())
    (row,) = load_rows(path)
    assert (row["prompt"], row["answer"]) == ("q?", "4")


def test_jsonl_byte_order_mark_is_not_a_bad_first_line(tmp_path: Path) -> None:
    """Windows tools (PowerShell 5's Out-File, Notepad's 'UTF-8 with BOM') put one before the
    first object: the CSV reader drops it, the JSONL reader called line 1 invalid JSON."""
    path = tmp_path / "windows.jsonl"
    path.write_bytes(
        '\ufeff{"prompt": "q?", "answer": "4"}\r\n{"prompt": "r?", "answer": "5"}\r\n'.encode()
    )
    rows = load_rows(path)
    assert [(r["prompt"], r["answer"]) for r in rows] == [("q?", "4"), ("r?", "5")]
