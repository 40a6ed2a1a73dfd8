"""Metric sinks: one JSON line per step in ``run_dir/metrics.jsonl``, optionally TensorBoard / W&B.

The JSONL file is the record of truth (the report and resume read it); TensorBoard and W&B are
mirrors for people who like dashboards. Each line is flushed and fsynced as it is written, so a
killed run loses at most the line being written, and :func:`read_metrics` skips such a torn line.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlvr.jsonio import atomic_write_text, drop_torn_tail, dumps_line, read_jsonl, to_jsonable

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


def _module_available(name: str) -> bool:
    """True when ``name`` can be imported (checked without importing it)."""
    return importlib.util.find_spec(name) is not None


def _step_of(metrics: Mapping[str, Any]) -> int:
    """The integer ``step`` of a metrics dict; a clear error when missing or not a whole number."""
    if "step" not in metrics:
        raise ValueError(f"metrics must contain 'step'; got keys {sorted(metrics)}")
    step = to_jsonable(metrics["step"])
    if isinstance(step, bool) or not isinstance(step, int | float) or step != int(step):
        raise ValueError(f"metrics['step'] must be a whole number, got {metrics['step']!r}")
    if step < 0:
        raise ValueError(f"metrics['step'] must be >= 0, got {step}")
    return int(step)


def _finite_scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric entries of ``metrics`` (what dashboards can plot), ``step`` excluded."""
    out: dict[str, float] = {}
    for key, value in to_jsonable(dict(metrics)).items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


class MetricsLogger:
    """Write each step's metrics dict to ``run_dir/metrics.jsonl`` (and TB / W&B when asked).

    Args:
        run_dir: the run directory (created if missing).
        tensorboard: also write TensorBoard event files under ``run_dir/tensorboard``; needs the
            ``tensorboard`` extra (``pip install rlvr[tensorboard]``).
        wandb: also log to Weights & Biases in offline mode (files under ``run_dir/wandb``; sync
            later with ``wandb sync``). ``WANDB_MODE`` in the environment overrides "offline".
            Needs the ``wandb`` extra (``pip install rlvr[wandb]``).
        wandb_project: W&B project name (default "rlvr").
        run_name: display name for W&B / the TB run (default: the run directory's name).

    An existing ``metrics.jsonl`` is appended to (resume: call :func:`truncate_metrics` first so
    steps are not duplicated); a torn last line left by a crash is cut off before appending.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        tensorboard: bool = False,
        wandb: bool = False,
        wandb_project: str | None = None,
        run_name: str | None = None,
    ) -> None:
        # Check the optional extras before touching the disk, so a misconfigured run fails fast.
        if tensorboard and not _module_available("tensorboard"):
            raise ImportError(
                "tensorboard=True but the 'tensorboard' package is not installed; "
                "install the extra with `pip install rlvr[tensorboard]` or turn tensorboard off"
            )
        if wandb and not _module_available("wandb"):
            raise ImportError(
                "wandb=True but the 'wandb' package is not installed; "
                "install the extra with `pip install rlvr[wandb]` or turn wandb off"
            )
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        removed = drop_torn_tail(self.path)
        if removed:
            log.warning("cut a torn last line (%d bytes) off %s", removed, self.path)
        self._file = self.path.open("a", encoding="utf-8")
        name = run_name or self.run_dir.name
        self._tb: Any = None
        self._wandb_run: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard" / name))
        if wandb:
            import wandb as wandb_module

            self._wandb_run = wandb_module.init(
                project=wandb_project or "rlvr",
                name=name,
                dir=str(self.run_dir),
                mode=os.environ.get("WANDB_MODE", "offline"),
                resume="allow",
            )

    def log(self, metrics: Mapping[str, Any]) -> None:
        """Append ``metrics`` (must contain ``step``) as one JSON line, flushed and fsynced.

        Non-finite floats are written as the strings "NaN" / "Infinity" / "-Infinity" (strict
        JSON); :func:`read_metrics` turns them back into floats. Tensors with one element become
        numbers. TensorBoard and W&B receive only the finite numeric values.
        """
        if self._file is None:
            raise RuntimeError(f"MetricsLogger for {self.run_dir} is closed")
        if not isinstance(metrics, Mapping):
            raise TypeError(f"metrics must be a dict, got {type(metrics).__name__}")
        step = _step_of(metrics)
        line = dumps_line({**metrics, "step": step})
        self._file.write(line)
        self._file.flush()
        os.fsync(self._file.fileno())
        if self._tb is not None or self._wandb_run is not None:
            scalars = _finite_scalars(metrics)
            if self._tb is not None:
                for key, value in scalars.items():
                    self._tb.add_scalar(key, value, global_step=step)
            if self._wandb_run is not None:
                self._wandb_run.log(scalars, step=step)

    def close(self) -> None:
        """Close the file and the optional sinks (safe to call twice)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All step dicts in ``run_dir/metrics.jsonl``, in file order (``[]`` when there is none).

    A torn last line (a crash mid-write) is skipped; a damaged line elsewhere raises
    ``ValueError`` with the line number. "NaN" / "Infinity" markers come back as floats.
    """
    return read_jsonl(Path(run_dir) / METRICS_FILE)


def truncate_metrics(run_dir: Path, after_step: int) -> int:
    """Keep only the lines of ``run_dir/metrics.jsonl`` with ``step <= after_step``.

    Used on resume from the checkpoint of ``after_step`` so the steps that are re-run are not
    logged twice. The file is rewritten atomically (temp file + rename), so a crash during the
    rewrite leaves the old file. A torn last line is dropped. Returns the number of lines kept.
    """
    if isinstance(after_step, bool) or not isinstance(after_step, int):
        raise TypeError(f"after_step must be an int, got {after_step!r}")
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return 0
    kept = [r for r in read_metrics(run_dir) if _step_of(r) <= after_step]
    atomic_write_text(path, "".join(dumps_line(r) for r in kept))
    return len(kept)
