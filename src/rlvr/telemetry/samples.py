"""Sampled completions, one JSON-lines file per step under ``run_dir/samples/``.

Reading what the model actually wrote is the fastest way to spot reward hacking and length
collapse (one-step answers that score full reward are obvious in the text, invisible in the means); the report shows a few of them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlvr.jsonio import atomic_write_text, dumps_line, read_jsonl

SAMPLES_DIR = "samples"
_SAMPLE_FILE = re.compile(r"^step_(\d+)\.jsonl$")


def samples_path(run_dir: Path, step: int) -> Path:
    """``run_dir/samples/step_000010.jsonl`` for step 10 (six digits, zero-padded)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    return Path(run_dir) / SAMPLES_DIR / f"step_{step:06d}.jsonl"


def write_samples(run_dir: Path, step: int, records: Sequence[Mapping[str, Any]]) -> Path:
    """Write ``records`` (e.g. prompt, response, reward, info) for ``step``; returns the path.

    Each record becomes one strict-JSON line (non-finite floats as "NaN"/"Infinity" strings).
    The file is written atomically, so re-writing a step after a resume replaces it whole.
    """
    path = samples_path(run_dir, step)
    for index, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise TypeError(f"records[{index}] must be a dict, got {type(record).__name__}")
    atomic_write_text(path, "".join(dumps_line(record) for record in records))
    return path


def list_sample_steps(run_dir: Path) -> list[int]:
    """Steps that have a samples file, ascending."""
    folder = Path(run_dir) / SAMPLES_DIR
    if not folder.is_dir():
        return []
    steps = []
    for path in folder.iterdir():
        match = _SAMPLE_FILE.match(path.name)
        if match:
            steps.append(int(match.group(1)))
    return sorted(steps)


def read_samples(run_dir: Path, step: int) -> list[dict[str, Any]]:
    """The records written for ``step`` (``[]`` when that step has no file)."""
    return read_jsonl(samples_path(run_dir, step))
