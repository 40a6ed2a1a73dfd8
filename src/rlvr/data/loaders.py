"""Load prompt/answer rows from JSONL, JSON, CSV, Parquet or a `datasets` folder.

Every loader yields the original record plus its location; one function,
`_normalise`, turns each record into the row shape the rest of rlvr reads:

    {**original_fields, "prompt": str, "answer": str, "_source": "file:N",
     "system_prompt": str}          # system_prompt only when one is given

`N` in `_source` is the 1-based line number for line-based files (.jsonl, .csv)
and the 0-based row index for the others (.json list, .parquet, `datasets`
folders); error messages spell out which ("line 7" or "row 6"). The normalised keys
replace original fields of the same name (a row read with answer_field="label" that also
has an "answer" field keeps "label" and gets "answer" overwritten).

Bad records either raise `DataError` naming the file, the line/row and the field
(`on_bad_row="error"`, the default) or are skipped and counted in a `LoadReport`
(`on_bad_row="skip"`).
"""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from rlvr.data.hub import ANSWER_EXTRACT, extract_reference, parse_source, read_dataset_records
from rlvr.data.records import KNOWN_FORMATS, BadRecord, BadRow, DataError, LoadReport, Record

logger = logging.getLogger(__name__)


def load_rows(
    path: str | Path,
    *,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    system_prompt: str | None = None,
    require_answer: bool = True,
    on_bad_row: Literal["error", "skip"] = "error",
    limit: int | None = None,
    split: str | None = None,
    answer_extract: str = "none",
) -> list[dict]:
    """Load and normalise rows; log a one-line summary. See `load_rows_with_report` for arguments."""
    rows, report = load_rows_with_report(
        path,
        prompt_field=prompt_field,
        answer_field=answer_field,
        system_prompt=system_prompt,
        require_answer=require_answer,
        on_bad_row=on_bad_row,
        limit=limit,
        split=split,
        answer_extract=answer_extract,
    )
    logger.log(logging.WARNING if report.skipped else logging.INFO, report.summary())
    return rows


def load_rows_with_report(
    path: str | Path,
    *,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    system_prompt: str | None = None,
    require_answer: bool = True,
    on_bad_row: Literal["error", "skip"] = "error",
    limit: int | None = None,
    split: str | None = None,
    answer_extract: str = "none",
) -> tuple[list[dict], LoadReport]:
    """Load rows from `path` and report what was kept and skipped.

    Args:
        path: a .jsonl, .json (a list of objects), .csv or .parquet file, a dataset folder (hub
            layout or save_to_disk) or a hub id ``hf:owner/name?split=...`` (`rlvr.data.hub`).
        prompt_field: field holding the problem text; copied to `row["prompt"]`.
        answer_field: field holding the reference answer; copied to `row["answer"]` as a string.
        system_prompt: when given, stored as `row["system_prompt"]` on every row.
        require_answer: when False a missing answer becomes "" instead of a bad row.
        on_bad_row: "error" raises DataError at the first bad record; "skip" counts and skips it.
        limit: stop after this many good rows.
        split: the split to read from a dataset folder or hub id (when the path names none).
        answer_extract: none, gsm8k ('#### x') or boxed (last \\boxed{}) of the answer field.

    Raises:
        DataError: missing or unreadable input, a bad record (in "error" mode), or no usable rows.
    """
    if on_bad_row not in ("error", "skip"):
        raise ValueError(f"on_bad_row must be 'error' or 'skip', got {on_bad_row!r}")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
    for name, value in (("prompt_field", prompt_field), ("answer_field", answer_field)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name} must be a non-empty string, got {value!r}")

    src = parse_source(path, split)
    if answer_extract not in ANSWER_EXTRACT:
        raise ValueError(f"answer_extract must be one of {ANSWER_EXTRACT}, got {answer_extract!r}")
    report = LoadReport(path=str(path))
    rows: list[dict] = []
    source_name = src.name
    records = _read_file(Path(path)) if src.kind == "file" else read_dataset_records(src)
    for record in records:
        report.records_read += 1
        source = f"{source_name}:{record.number}"
        try:
            if record.error is not None:
                raise record.error
            row = _normalise(
                record.value, prompt_field, answer_field, require_answer, system_prompt
            )
            if row["answer"]:
                row["answer"] = extract_reference(row["answer"], answer_extract, answer_field)
            # imported here: multimodal loads torch, which `rlvr --help` and `rlvr data` never need
            from rlvr.data.multimodal import resolve_image_paths

            # relative image paths name files beside the data file; a missing one is a bad row
            missing = resolve_image_paths(row, Path(path).parent) if src.kind == "file" else []
            if missing:
                raise BadRecord("missing_image", f"field 'images': no such file {missing[0]}")
        except BadRecord as bad:
            message = f"{path} {record.where}: {bad.message}"
            if on_bad_row == "error":
                raise DataError(message) from None
            report.skipped.append(BadRow(source=source, kind=bad.kind, message=message))
            continue
        row["_source"] = source
        rows.append(row)
        if limit is not None and len(rows) >= limit:
            break
    report.rows_kept = len(rows)
    if not rows:
        raise DataError(f"{path}: no usable rows ({report.summary()})")
    return rows, report


def _normalise(
    value: Any,
    prompt_field: str,
    answer_field: str,
    require_answer: bool,
    system_prompt: str | None,
) -> dict:
    """Check one record and add the normalised keys. Raises BadRecord naming the field."""
    if not isinstance(value, dict):
        raise BadRecord("not_an_object", f"expected an object, got {type(value).__name__}")
    present = ", ".join(repr(k) for k in value) or "none"
    prompt = value.get(prompt_field)
    if prompt is None:
        raise _missing("prompt", prompt_field, value, present)
    if not isinstance(prompt, str):
        raise BadRecord(
            "wrong_type",
            f"prompt field {prompt_field!r} must be a string, got {type(prompt).__name__}",
        )
    if not prompt.strip():
        raise BadRecord("empty_field", f"prompt field {prompt_field!r} is empty")

    raw_answer = value.get(answer_field)
    if raw_answer is None:
        if require_answer:
            raise _missing("answer", answer_field, value, present)
        answer = ""
    else:
        answer = _answer_to_str(raw_answer, answer_field)
        if require_answer and not answer:
            raise BadRecord("empty_field", f"answer field {answer_field!r} is empty")

    for role, name, text in (("prompt", prompt_field, prompt), ("answer", answer_field, answer)):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # e.g. a lone surrogate escape "\ud800" in JSON
            raise BadRecord(
                "bad_text",
                f"{role} field {name!r} is not valid Unicode text ({exc.reason} at {exc.start})",
            ) from None

    row = dict(value)
    row["prompt"] = prompt
    row["answer"] = answer
    if system_prompt is not None:
        row["system_prompt"] = system_prompt
    return row


def _missing(role: str, name: str, value: dict, present: str) -> BadRecord:
    """A missing field and a null one read differently; both are "missing_field" when counted."""
    if name in value:
        return BadRecord("missing_field", f"{role} field {name!r} is null")
    likely = next((k for k in _LIKELY[role] if k in value), None)
    knob = f"data.{role}_field"
    hint = f"{knob}={likely}" if likely else f"{knob}=<the field that holds it>"
    return BadRecord(
        "missing_field",
        f"no {role} field {name!r} (fields present: {present}); name it with {hint}",
    )


# the names a row's prompt and answer usually go by, in the order one is suggested
_LIKELY = {
    "prompt": ("question", "problem", "query", "input", "instruction", "text"),
    "answer": ("solution", "target", "label", "output", "ground_truth", "final_answer"),
}


def _answer_to_str(raw: Any, answer_field: str) -> str:
    """Reference answers become stripped strings; numbers are converted.

    Integral floats lose the ".0": JSON writers and dataframe libraries often turn an integer
    column into floats (42 -> 42.0), and "42.0" would then fail an exact-match comparison
    against "42". Other floats use repr, the shortest text that reads back to the same float.
    """
    if isinstance(raw, str):
        return raw.strip()
    if isinstance(raw, list) and len(raw) == 1:  # e.g. OlympiadBench's final_answer: ["$x$"]
        return _answer_to_str(raw[0], answer_field)
    if isinstance(raw, bool):  # bool is an int subclass; True is not a reference answer
        raise BadRecord(
            "wrong_type", f"answer field {answer_field!r} must be a string or number, got bool"
        )
    if isinstance(raw, int):
        return str(raw)
    if isinstance(raw, float):
        if not math.isfinite(raw):
            raise BadRecord("wrong_type", f"answer field {answer_field!r} is {raw}")
        return str(int(raw)) if raw.is_integer() else repr(raw)
    raise BadRecord(
        "wrong_type",
        f"answer field {answer_field!r} must be a string or number, got {type(raw).__name__}",
    )


# --------------------------------------------------------------------------- readers


def _read_file(path: Path) -> Iterator[Record]:
    """Pick the reader of a local file by its suffix."""
    readers = {
        ".jsonl": _read_jsonl,
        ".json": _read_json,
        ".csv": _read_csv,
        ".parquet": _read_parquet,
    }
    suffix = path.suffix.lower()
    if suffix not in readers:
        raise DataError(
            f"{path}: unknown format {suffix or '(no suffix)'!r}; known: {', '.join(KNOWN_FORMATS)}"
        )
    return readers[suffix](path)


def _read_jsonl(path: Path) -> Iterator[Record]:
    # Read bytes and decode line by line, so one badly encoded line is one bad record.
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            where = f"line {number}"
            try:  # the first line may start with a byte-order mark (Windows tools write one)
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as err:
                bad = BadRecord("invalid_utf8", f"not UTF-8 text ({err.reason})")
                yield Record(number, where, error=bad)
                continue
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as err:
                bad = BadRecord("invalid_json", f"invalid JSON ({err.msg} at column {err.colno})")
                yield Record(number, where, error=bad)
                continue
            yield Record(number, where, value)


def _read_json(path: Path) -> Iterator[Record]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        # A broken .json file cannot be read row by row, so this is never skippable.
        raise DataError(f"{path} line {err.lineno}: invalid JSON ({err.msg})") from None
    if not isinstance(data, list):
        raise DataError(
            f"{path}: a .json input must hold a list of objects, got {type(data).__name__} "
            "(use .jsonl for one object per line)"
        )
    for index, value in enumerate(data):
        yield Record(index, f"row {index}", value)


def _read_csv(path: Path) -> Iterator[Record]:
    try:
        yield from _read_csv_records(path)
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err.reason})") from None
    except csv.Error as err:
        raise DataError(f"{path}: unreadable CSV ({err})") from None


def _read_csv_records(path: Path) -> Iterator[Record]:
    # utf-8-sig drops the byte-order mark that spreadsheet exports put before the header.
    with path.open(encoding="utf-8-sig", newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            return
        repeated = sorted({name for name in header if header.count(name) > 1})
        if repeated:
            raise DataError(f"{path} line 1: the header repeats column(s) {repeated}")
        end_of_previous = reader.line_num
        for cells in reader:
            # A quoted field may span lines; report the line the record starts on.
            number = end_of_previous + 1
            end_of_previous = reader.line_num
            if not cells:
                continue
            if len(cells) != len(header):
                bad = BadRecord(
                    "bad_csv_row", f"has {len(cells)} fields but the header has {len(header)}"
                )
                yield Record(number, f"line {number}", error=bad)
                continue
            yield Record(number, f"line {number}", dict(zip(header, cells, strict=True)))


def _read_parquet(path: Path) -> Iterator[Record]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises several types for a corrupt file
        raise DataError(f"{path}: not a readable Parquet file ({err})") from None
    index = 0
    for batch in parquet.iter_batches(batch_size=1024):
        for value in batch.to_pylist():
            yield Record(index, f"row {index}", value)
            index += 1
