"""JSON-lines helpers shared by the telemetry writers and readers.

Python's ``json`` writes ``NaN`` and ``Infinity`` by default, which is not JSON (``jq`` and most
other readers reject the whole file). Every telemetry file goes through :func:`to_jsonable`, which
writes the three non-finite floats as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``;
:func:`from_jsonable` turns those strings back into floats when a file is read.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# The strings written in place of non-finite floats, and back.
NONFINITE_TO_STR = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
STR_TO_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def to_jsonable(value: Any) -> Any:
    """``value`` made safe for strict JSON.

    Non-finite floats become the strings above; tensors / numpy scalars with one element become
    Python numbers (so a stray ``loss.detach()`` in a metrics dict does not crash the logger);
    mappings, lists and tuples are converted recursively; other objects fall back to ``str``.
    """
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return float(value)
        if math.isnan(value):
            return NONFINITE_TO_STR["nan"]
        return NONFINITE_TO_STR["inf" if value > 0 else "-inf"]
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    # torch.Tensor / numpy scalar with one element: take the Python number.
    item = getattr(value, "item", None)
    if callable(item):
        numel = getattr(value, "numel", None) or getattr(value, "size", None)
        count = numel() if callable(numel) else numel
        if count in (None, 1):
            return to_jsonable(item())
        tolist = getattr(value, "tolist", None)
        if callable(tolist):
            return to_jsonable(tolist())
    return str(value)


def from_jsonable(value: Any) -> Any:
    """Inverse of :func:`to_jsonable` for the non-finite markers (recursively)."""
    if isinstance(value, str):
        return STR_TO_NONFINITE.get(value, value)
    if isinstance(value, dict):
        return {k: from_jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_jsonable(v) for v in value]
    return value


# Characters that str.splitlines() (and some editors) treat as line breaks although JSON allows
# them raw inside strings; escaping them keeps one record per physical line for every reader.
_LINE_BREAK_ESCAPES = str.maketrans({"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def dumps_line(record: Mapping[str, Any]) -> str:
    """One strict-JSON line (with trailing newline) for ``record``; non-ASCII text stays readable."""
    text = json.dumps(to_jsonable(record), allow_nan=False, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (a str no UTF-8 file can hold) are written as their visible escape,
        # e.g. the six characters "\ud800": the line stays valid and says what was there.
        text = json.dumps(
            _visible_surrogates(to_jsonable(record)), allow_nan=False, ensure_ascii=False
        )
    return text.translate(_LINE_BREAK_ESCAPES) + "\n"


def _visible_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_visible_surrogates(k): _visible_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_visible_surrogates(v) for v in value]
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name!r}")


def loads_strict(line: str) -> Any:
    """Parse one JSON document, rejecting ``NaN``/``Infinity`` tokens, and restore markers."""
    return from_jsonable(json.loads(line, parse_constant=_reject_constant))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All records of a JSON-lines file; a torn (unparseable) *last* line is dropped.

    A process killed mid-write leaves at most one partial line at the end; that is expected and
    skipped. A bad line anywhere else means the file was damaged, and raises ``ValueError``
    naming the file and line number. A missing file gives an empty list.
    """
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    while lines and not lines[-1].strip():
        lines.pop()  # the newline after the last record
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = loads_strict(line)
        except ValueError as err:  # json.JSONDecodeError is a ValueError
            if number == len(lines):
                break  # torn last line from an interrupted write
            raise ValueError(f"{path}:{number}: not a JSON line ({err})") from err
        if not isinstance(record, dict):
            raise ValueError(
                f"{path}:{number}: expected a JSON object, got {type(record).__name__}"
            )
        records.append(record)
    return records


def _umask() -> int:
    """The process's umask, read without changing it where the system says (Linux); else set
    and restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_file_mode() -> int:
    """The permissions ``open()`` gives a new file: 0666 less the umask."""
    return 0o666 & ~_umask()


def open_up_files(folder: Path) -> None:
    """Give every file under ``folder`` the permissions ``open()`` would: writers that go
    through a temporary file (safetensors' ``save_file``, mkstemp) leave them owner-only."""
    mode = default_file_mode()
    for path in Path(folder).rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.chmod(path, mode)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so a reader sees either the old file or the new one, whole.

    The file gets the permissions ``open()`` would give it (0666 less the umask): mkstemp's
    temporary file is owner-only, which the rename would otherwise keep."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, default_file_mode())
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def drop_torn_tail(path: Path) -> int:
    """Cut a partial last line (no trailing newline) off ``path``; returns bytes removed.

    A last line that is a complete JSON object and only lacks its newline is kept (the newline
    is added). Appending after a torn line would glue the new record onto the fragment and damage both, so
    every appender calls this before its first write.
    """
    if not path.exists():
        return 0
    with path.open("rb+") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return 0
        # Walk back in blocks to the last newline; keep everything up to and including it.
        end = size
        keep = 0
        while end > 0:
            start = max(0, end - 65536)
            handle.seek(start)
            block = handle.read(end - start)
            cut = block.rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            end = start
        handle.seek(keep)
        tail = handle.read(size - keep)
        try:
            complete = isinstance(loads_strict(tail.decode("utf-8")), dict)
        except ValueError:  # also covers UnicodeDecodeError from a cut multi-byte character
            complete = False
        if complete:
            # A whole record that only lacks its newline: keep it, finish the line.
            handle.seek(size)
            handle.write(b"\n")
            removed = 0
        else:
            handle.truncate(keep)
            removed = size - keep
        handle.flush()
        os.fsync(handle.fileno())
        return removed


def append_line(path: Path, record: Mapping[str, Any]) -> None:
    """Append one JSON line to ``path`` and fsync it (used for rare events, not per-step)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    drop_torn_tail(path)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(dumps_line(record))
        handle.flush()
        os.fsync(handle.fileno())
