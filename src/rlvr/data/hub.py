"""Datasets from the Hugging Face hub or a local folder in hub layout, read through `datasets`.

A data path (``data.train_path``, ``data.eval_path``, ``eval.sets[].path``) is one of:

    train.jsonl                                   a local file (rlvr.data.loaders reads it)
    data/gsm8k?split=test                         a local folder in hub layout: parquet/json/csv
                                                  data files (+ a README.md dataset card)
    hf:openai/gsm8k?config=main&split=train       a hub id; options: split, config, revision,
                                                  streaming (true: rows are read as they arrive)

A folder and a hub id go through the same call, ``datasets.load_dataset(location, name=config,
split=split, revision=revision, streaming=streaming)``, so a test on a folder made by the test
exercises the path a hub id takes. Downloads are cached by `datasets` (``HF_DATASETS_CACHE``).
A folder written by ``save_to_disk`` (it has ``dataset_info.json`` or ``dataset_dict.json``) is
read with ``load_from_disk`` instead. A hub id that cannot be reached fails with
`HubUnreachable`, which names the id and says how to work offline.

``answer_extract`` turns a worked solution into the reference answer: ``gsm8k`` takes the text
after GSM8K's ``#### `` line, ``boxed`` the last ``\\boxed{}`` of a solution (MATH); both reuse
`rlvr.rewards.extract`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl

from rlvr.data.records import BadRecord, DataError, Record
from rlvr.rewards.extract import gsm8k_answer, last_boxed

HUB_PREFIX = "hf:"
OPTIONS = ("split", "config", "revision", "streaming")
ANSWER_EXTRACT = ("none", "gsm8k", "boxed")
SAVE_TO_DISK_MARKERS = ("dataset_info.json", "dataset_dict.json", "state.json")
OFFLINE_HINT = (
    "to work offline, download it once with network access and set HF_HUB_OFFLINE=1 (it is then "
    "read from the datasets cache), or save it to a local folder "
    "(`huggingface-cli download --repo-type dataset ID --local-dir DIR`) and give that folder "
    "as the path"
)


class HubUnreachable(DataError):
    """A hub dataset could not be fetched (no network, offline mode, unknown id, no access)."""


@dataclass(frozen=True)
class Source:
    """A parsed data path: ``kind`` file, folder (hub layout), saved (save_to_disk) or hub."""

    text: str
    kind: Literal["file", "folder", "saved", "hub"]
    location: str
    split: str | None = None
    config: str | None = None
    revision: str | None = None
    streaming: bool = False

    @property
    def name(self) -> str:
        """Short name for row sources (``gsm8k/test:7``)."""
        base = self.location.rstrip("/").rsplit("/", 1)[-1] or self.location
        return base if self.split is None else f"{base}/{self.split}"


def is_hub(text: str) -> bool:
    return str(text).startswith(HUB_PREFIX)


def _missing_path_hint(path: Path) -> str:
    """Where a missing relative path was looked for, and the file beside it that it misspells."""
    from rlvr.config.peer_names import near_miss

    here = "" if path.is_absolute() else f"; relative to {Path.cwd()}"
    folder = path.parent
    try:
        names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
    except OSError:
        names = []
    close = near_miss(path.name, names)
    return here + (f"; did you mean {str(folder / close)!r}?" if close else "")


def parse_source(text: str | Path, split: str | None = None) -> Source:
    """Parse a data path; ``split`` (the caller's) is used when the path names none.

    Raises DataError for an unknown option or a local path that does not exist.
    """
    raw = str(text)
    location, query = raw, ""
    if "?" in raw and not Path(raw).exists():
        location, _, query = raw.partition("?")
    opts: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key not in OPTIONS:
            raise DataError(f"{raw}: unknown option {key!r}; known: {', '.join(OPTIONS)}")
        opts[key] = value
    streaming = opts.get("streaming", "false").lower()
    if streaming not in ("true", "false", "1", "0"):
        raise DataError(f"{raw}: streaming={streaming!r} must be true or false")
    common = dict(
        split=opts.get("split") or split,
        config=opts.get("config"),
        revision=opts.get("revision"),
        streaming=streaming in ("true", "1"),
    )
    if is_hub(location):
        repo = location[len(HUB_PREFIX) :].strip("/")
        if repo.count("/") > 1 or not repo:
            raise DataError(f"{raw}: a hub id looks like hf:owner/name or hf:name, got {repo!r}")
        return Source(raw, "hub", repo, **common)
    path = Path(location)
    if not path.exists():
        raise DataError(
            f"{raw}: no such file or folder (a hub dataset is written hf:owner/name?split=...)"
            + _missing_path_hint(path)
        )
    if path.is_dir():
        saved = any((path / m).exists() for m in SAVE_TO_DISK_MARKERS)
        return Source(raw, "saved" if saved else "folder", location, **common)
    if query or split is not None:
        given = query or f"split={split!r}"
        raise DataError(f"{raw}: {given} applies to a dataset folder or hub id, not a file")
    return Source(raw, "file", location)


def missing_local(text: str) -> str | None:
    """Why a configured local data path cannot be used, or None (hub ids are not checked here)."""
    try:
        parse_source(text)
    except DataError as exc:
        return str(exc)
    return None


def read_dataset_records(src: Source) -> Iterator[Record]:
    """Records of a hub id or a folder (hub layout or save_to_disk), one per row, 0-based."""
    dataset = _load_saved(src) if src.kind == "saved" else _load(src)
    for index, value in enumerate(dataset):
        yield Record(index, f"row {index}", value)


def _load(src: Source) -> Any:
    """``datasets.load_dataset`` for a folder or a hub id: the one code path for both."""
    import datasets

    where = f"hub dataset {src.location!r}" if src.kind == "hub" else f"dataset folder {src.text}"
    try:
        loaded = datasets.load_dataset(
            src.location,
            name=src.config,
            split=src.split,
            revision=src.revision,
            streaming=src.streaming,
        )
    except ValueError as exc:  # an unknown split or config: the message lists the known ones
        raise DataError(f"{where}: {_first_line(exc)}") from None
    except (ConnectionError, OSError) as exc:
        if src.kind != "hub":
            raise DataError(f"{where}: cannot be read ({_first_line(exc)})") from None
        raise HubUnreachable(
            f"{where} could not be loaded ({_first_line(exc)}); {OFFLINE_HINT}"
        ) from None
    except Exception as exc:  # datasets raises its own types (DatasetNotFoundError, ...)
        cls = HubUnreachable if src.kind == "hub" else DataError
        hint = f"; {OFFLINE_HINT}" if src.kind == "hub" else ""
        raise cls(f"{where}: {type(exc).__name__}: {_first_line(exc)}{hint}") from None
    return _one_split(loaded, src, where)


def _load_saved(src: Source) -> Any:
    import datasets

    try:
        loaded = datasets.load_from_disk(src.location)
    except FileNotFoundError as exc:
        raise DataError(f"{src.text}: not a datasets save_to_disk folder ({exc})") from None
    if not isinstance(loaded, datasets.DatasetDict) and src.split is not None:
        raise DataError(
            f"{src.text} is a single Dataset; split={src.split!r} applies to DatasetDict"
        )
    return _one_split(loaded, src, f"{src.text}")


def _one_split(loaded: Any, src: Source, where: str) -> Any:
    """A Dataset from what load_dataset returned; a dict of splits needs the split named."""
    if not hasattr(loaded, "keys"):
        return loaded
    splits = sorted(loaded.keys())
    if src.split is not None:
        if src.split not in loaded:
            raise DataError(f"{where}: unknown split {src.split!r}; known: {', '.join(splits)}")
        return loaded[src.split]
    if len(splits) == 1:
        return loaded[splits[0]]
    raise DataError(
        f"{where} has several splits: pass split= or add ?split=NAME to the path "
        f"(one of: {', '.join(splits)})"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def extract_reference(answer: str, mode: str, field: str) -> str:
    """The reference answer inside a worked solution (``mode`` gsm8k or boxed; none: as is).

    Raises `BadRecord` naming the field when the solution holds no such answer.
    """
    if mode == "none":
        return answer

    found = gsm8k_answer(answer) if mode == "gsm8k" else last_boxed(answer)
    if not found:
        what = "'#### answer' line" if mode == "gsm8k" else "\\boxed{} answer"
        snippet = answer if len(answer) <= 60 else "..." + answer[-57:]
        raise BadRecord("no_answer", f"answer field {field!r} has no {what}: {snippet!r}")
    return found.replace(",", "") if mode == "gsm8k" else found
