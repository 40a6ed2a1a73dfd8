"""The record types data readers share: a raw record, why one is bad, what a load kept and skipped."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

KNOWN_FORMATS = (".jsonl", ".json", ".csv", ".parquet", "a dataset folder", "hf:owner/name")


class DataError(ValueError):
    """A data file, or a row in it, cannot be used. The message names file, line/row and field."""


@dataclass(frozen=True)
class BadRow:
    """One skipped record: where it was (`source` = "file:N"), a short `kind`, and the full message."""

    source: str
    kind: str
    message: str


@dataclass
class LoadReport:
    """What `load_rows_with_report` read, kept and skipped from one input."""

    path: str
    records_read: int = 0
    rows_kept: int = 0
    skipped: list[BadRow] = field(default_factory=list)

    @property
    def skipped_by_kind(self) -> dict[str, int]:
        """Number of skipped records per kind, e.g. {"invalid_json": 2, "missing_field": 1}."""
        return dict(Counter(bad.kind for bad in self.skipped))

    def summary(self) -> str:
        """One line for the log, with the first skipped record's message when there is one."""
        text = (
            f"{self.path}: read {self.records_read} records, kept {self.rows_kept}, "
            f"skipped {len(self.skipped)}"
        )
        if self.skipped:
            kinds = ", ".join(f"{k}: {n}" for k, n in sorted(self.skipped_by_kind.items()))
            text += f" ({kinds}); first skipped: {self.skipped[0].message}"
        return text


class BadRecord(Exception):
    """Raised by the readers (`rlvr.data.loaders`, `rlvr.data.hub`) and the normaliser; becomes a
    DataError or a skipped BadRow."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True)
class Record:
    """A raw record before normalisation. `where` reads "line 7" or "row 6"; `number` is 7 or 6."""

    number: int
    where: str
    value: Any = None
    error: BadRecord | None = None  # set when the reader could not even parse the record
