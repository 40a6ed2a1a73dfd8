"""Training checkpoints: atomic writes, a completeness marker, rotation, and exact restore.

A checkpoint is a folder ``RUN_DIR/checkpoints/step_NNNNNN`` holding

    model/                 HF folder: full weights, or only the adapter of a LoRA run (+ tokenizer)
    trainer_state.pt       tensors: optimizer, LR scheduler, the objective's modules, torch RNG
    trainer_state.json     step, policy version, data-sampler position, KL coefficient,
                           python/numpy RNG, ``extra``
    config.yaml            the run config when it was written
    COMPLETE               written last: the step and the size of every file above

It is written under ``checkpoints/.tmp-step_NNNNNN``, every file is fsynced, ``COMPLETE`` goes in
last and the folder is then renamed into place. A folder without a ``COMPLETE`` that matches its
files is never loaded, so a kill at any moment leaves the previous checkpoint as the newest one.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlvr.checkpoint.protocol import Checkpointable
from rlvr.jsonio import open_up_files
from rlvr.model.lora import is_lora_model, load_adapter_weights

log = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
COMPLETE = "COMPLETE"
MODEL_DIR = "model"
TENSOR_STATE = "trainer_state.pt"
PLAIN_STATE = "trainer_state.json"
CONFIG_FILE = "config.yaml"
TMP_PREFIX = ".tmp-"
FORMAT_VERSION = 2  # 2: the objective's modules under "objective", policy_version
_NAME = re.compile(r"^step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names the folder and the cause."""


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: Path


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR


# ----------------------------------------------------------------------------- finding


def read_marker(path: Path) -> dict | None:
    """The ``COMPLETE`` manifest of a checkpoint folder, or None when the folder is not complete.

    Complete means: the marker parses and every file it lists exists with the recorded size.
    """
    marker = Path(path) / COMPLETE
    try:
        manifest = json.loads(marker.read_text())
        files = manifest["files"]
        for rel, size in files.items():
            if (Path(path) / rel).stat().st_size != size:
                log.warning("checkpoint %s: %s has the wrong size; ignoring it", path, rel)
                return None
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("checkpoint %s has an unreadable %s (%s); ignoring it", path, COMPLETE, exc)
        return None
    return manifest


def list_checkpoints(run_dir: Path) -> list[CheckpointInfo]:
    """Complete checkpoints of a run, oldest first (torn or half-deleted folders are skipped)."""
    folder = checkpoints_dir(run_dir)
    if not folder.is_dir():
        return []
    out = []
    for path in folder.iterdir():
        match = _NAME.match(path.name)
        if match and path.is_dir() and read_marker(path) is not None:
            out.append(CheckpointInfo(int(match.group(1)), path))
    return sorted(out, key=lambda c: c.step)


def latest_checkpoint(run_dir: Path) -> CheckpointInfo | None:
    """The newest complete checkpoint of a run, or None."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def checkpoint_step(path: Path) -> int:
    """The step of a checkpoint folder; ``CheckpointError`` if it is not a complete checkpoint."""
    manifest = read_marker(Path(path))
    if manifest is None:
        raise CheckpointError(
            f"{path} is not a complete checkpoint (no valid {COMPLETE} marker): it was "
            "interrupted while being written or deleted"
        )
    return int(manifest["step"])


# ----------------------------------------------------------------------------- writing


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> dict[str, int]:
    """fsync every file and folder under ``root``; returns {relative path: size} of the files."""
    sizes = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            p = Path(dirpath) / name
            _fsync_path(p)
            sizes[str(p.relative_to(root))] = p.stat().st_size
        _fsync_path(Path(dirpath))
    return sizes


def write_checkpoint(
    run_dir: Path,
    step: int,
    *,
    model: torch.nn.Module,
    tokenizer: Any,
    tensors: dict[str, Any],
    plain: dict[str, Any],
    config_yaml: str,
) -> Path:
    """Write one checkpoint atomically and return its folder.

    ``tensors`` is saved with ``torch.save`` (it must load with ``weights_only=True``), ``plain``
    as JSON. On any failure (disk full, ...) the temporary folder is removed, every existing
    checkpoint is left as it was, and ``CheckpointError`` says what happened.
    """
    folder = checkpoints_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / checkpoint_name(step)
    tmp = folder / (TMP_PREFIX + final.name)
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        model.save_pretrained(tmp / MODEL_DIR)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / MODEL_DIR)
        with open(tmp / TENSOR_STATE, "wb") as f:  # a Python file keeps the OSError (ENOSPC...)
            torch.save(tensors, f)
        (tmp / PLAIN_STATE).write_text(json.dumps(plain))
        (tmp / CONFIG_FILE).write_text(config_yaml)
        open_up_files(tmp)  # safetensors writes weights owner-only
        sizes = _fsync_tree(tmp)
        manifest = {"format": FORMAT_VERSION, "step": step, "time": time.time(), "files": sizes}
        with open(tmp / COMPLETE, "w") as f:
            f.write(json.dumps(manifest, indent=1))
            f.flush()
            os.fsync(f.fileno())
        _fsync_path(tmp)
        if final.exists():  # a re-run of this step after a resume from an older checkpoint
            _remove_checkpoint(final)
        tmp.rename(final)
        _fsync_path(folder)
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        previous = latest_checkpoint(run_dir)
        usable = previous.path if previous else "none (this was the first save)"
        cause = _os_cause(exc)
        raise CheckpointError(
            f"could not write the checkpoint of step {step} to {final}: "
            f"{type(cause).__name__}: {cause}. The newest usable checkpoint is still {usable}. "
            f"Free disk space, then resume with `rlvr train --resume {run_dir}`."
        ) from exc
    return final


def _os_cause(exc: BaseException) -> BaseException:
    """The OSError behind ``exc`` if there is one (torch.save hides ENOSPC behind its own error)."""
    seen = exc
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return exc


def _remove_checkpoint(path: Path) -> None:
    """Delete a checkpoint so that a crash half-way never leaves something that looks complete."""
    marker = path / COMPLETE
    if marker.exists():
        marker.unlink()
        _fsync_path(path)
    shutil.rmtree(path)


def rotate_checkpoints(run_dir: Path, keep: int, protect: Iterable[int] = ()) -> list[Path]:
    """Keep the newest ``keep`` complete checkpoints (plus the steps in ``protect``).

    Also removes leftovers: torn ``step_*`` folders and ``.tmp-*`` folders of interrupted saves.
    Returns the removed folders.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    complete = list_checkpoints(run_dir)
    keep_steps = {c.step for c in complete[-keep:]} | set(protect)
    complete_paths = {c.path for c in complete}
    removed = []
    folder = checkpoints_dir(run_dir)
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        match = _NAME.match(path.name)
        stale_tmp = path.name.startswith(TMP_PREFIX)
        torn = match is not None and path not in complete_paths
        old = match is not None and path in complete_paths and int(match.group(1)) not in keep_steps
        if path.is_dir() and (stale_tmp or torn or old):
            _remove_checkpoint(path)
            removed.append(path)
    return removed


# ----------------------------------------------------------------------------- trainer state


def rng_state() -> tuple[dict, dict]:
    """(plain, tensors) RNG states of python, numpy and torch (+ CUDA when present)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    plain = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["cuda"] = torch.cuda.get_rng_state_all()
    return plain, tensors


def set_rng_state(plain: dict, tensors: dict) -> None:
    version, internal, gauss = plain["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = plain["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["torch"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(tensors["cuda"])


def capture_state(state: Checkpointable, extra: dict | None = None) -> tuple[dict, dict]:
    """Everything but the model weights that a run needs to continue exactly: (tensors, plain).

    ``extra`` holds other components' state (e.g. the in-training evaluator's early-stopping
    history); it must be JSON-serialisable.
    """
    rng_plain, rng_tensors = rng_state()
    tensors = {
        "optimizer": state.optimizer.state_dict(),
        "scheduler": state.scheduler.state_dict(),
        "objective": state.objective.state_dict(),
        "rng": rng_tensors,
    }
    plain = {
        "step": state.step,
        "policy_version": state.policy_version,
        "sampler": state.sampler.state_dict(),
        "kl_coef": state.kl_ctl.value,
        "rng": rng_plain,
        "extra": extra or {},
    }
    try:
        json.dumps(plain)
    except TypeError as exc:
        raise CheckpointError(f"checkpoint extra state is not JSON-serialisable: {exc}") from exc
    return tensors, plain


def save_checkpoint(
    state: Checkpointable,
    run_dir: Path,
    *,
    tokenizer: Any,
    config_yaml: str,
    extra: dict | None = None,
    keep: int = 2,
    protect: Iterable[int] = (),
) -> Path:
    """Checkpoint ``state`` at its current step, then rotate old checkpoints away."""
    tensors, plain = capture_state(state, extra)
    path = write_checkpoint(
        run_dir,
        state.step,
        model=state.model,
        tokenizer=tokenizer,
        tensors=tensors,
        plain=plain,
        config_yaml=config_yaml,
    )
    rotate_checkpoints(run_dir, keep, protect)
    return path


def read_state(path: Path) -> tuple[dict, dict]:
    """(tensors, plain) of a complete checkpoint folder."""
    checkpoint_step(path)  # refuses a torn folder
    manifest = read_marker(path) or {}
    if manifest.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format {manifest.get('format')!r}, this rlvr reads {FORMAT_VERSION}"
        )
    tensors = torch.load(Path(path) / TENSOR_STATE, map_location="cpu", weights_only=True)
    plain = json.loads((Path(path) / PLAIN_STATE).read_text())
    return tensors, plain


def restore_model(model: torch.nn.Module, folder: Path) -> None:
    """Load the weights saved in ``folder`` into ``model`` in place (adapter or full weights)."""

    if is_lora_model(model):
        load_adapter_weights(model, folder)
        return
    from transformers import AutoModelForCausalLM

    dtype = next(model.parameters()).dtype
    # Loading through transformers handles tied weights and sharded files; the copy is exact.
    saved = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    model.load_state_dict(saved.state_dict())


def restore_checkpoint(state: Checkpointable, path: Path) -> dict:
    """Put ``state`` back as it was when the checkpoint at ``path`` was written.

    Restores model (or adapter) weights, optimizer, scheduler, the objective's own modules (PPO's
    critic), data-sampler position, KL coefficient, step counter, policy version and RNG states.
    Returns the ``extra`` dict saved with it.
    """
    tensors, plain = read_state(path)
    restore_model(state.model, Path(path) / MODEL_DIR)
    state.optimizer.load_state_dict(tensors["optimizer"])
    restore_train_counters(state, tensors, plain, path)
    set_rng_state(plain["rng"], tensors["rng"])
    return plain["extra"]


def restore_train_counters(
    state: Checkpointable, tensors: dict, plain: dict, path: Path, *, objective: bool = True
) -> None:
    """What a full and a sharded checkpoint restore alike, besides model and optimizer: the
    scheduler, the objective's modules (unless ``objective`` is false: a sharded checkpoint
    restores them with the policy), the data position, the KL coefficient, the step counter and
    the policy version."""
    state.scheduler.load_state_dict(tensors["scheduler"])
    try:
        if objective:
            state.objective.load_state_dict(tensors["objective"])
    except ValueError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    state.sampler.load_state_dict(plain["sampler"])
    state.kl_ctl.value = float(plain["kl_coef"])
    state.step = int(plain["step"])
    state.policy_version = int(plain["policy_version"])
