"""Sharded checkpoints of an FSDP2 run with ``torch.distributed.checkpoint`` (DCP).

Same folder, marker and rotation rules as ``checkpoint.py``; the differences:

    dcp/                   DCP files: every rank writes its shard of ``model`` (a LoRA run:
                           its adapters only), ``objective`` (PPO's critic) and ``optim``
    rank_R.pt              per-rank RNG states (ranks draw different random numbers)
    model/                 config (+ adapter_config.json) + tokenizer only (no weights;
                           ``export_full_model`` makes them)
    trainer_state.pt       scheduler (rank 0)
    trainer_state.json     as in ``checkpoint.py``; COMPLETE records ``"sharded": world size``

Every rank writes into ``checkpoints/.tmp-step_N``; after a barrier rank 0 fsyncs, writes
``COMPLETE`` and renames the folder into place, then rotates. A sharded checkpoint loads into one
process (``rlvr eval``, ``rlvr merge``) through ``export_full_model``.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rlvr.checkpoint.full import (
    COMPLETE,
    CONFIG_FILE,
    FORMAT_VERSION,
    MODEL_DIR,
    PLAIN_STATE,
    TENSOR_STATE,
    TMP_PREFIX,
    CheckpointError,
    _fsync_path,
    _fsync_tree,
    _os_cause,
    _remove_checkpoint,
    capture_state,
    checkpoint_name,
    checkpoints_dir,
    latest_checkpoint,
    read_marker,
    read_state,
    restore_train_counters,
    rotate_checkpoints,
    set_rng_state,
)
from rlvr.checkpoint.protocol import Checkpointable
from rlvr.jsonio import open_up_files
from rlvr.model.lora import is_lora_model

DCP_DIR = "dcp"
FULL_MODEL_DIR = "full_model"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_NAME = "default"  # the one adapter rlvr.model.lora trains


def is_sharded(path: Path) -> bool:
    """True when the checkpoint at ``path`` was written by ``save_sharded_checkpoint``."""
    manifest = read_marker(Path(path)) or {}
    return bool(manifest.get("sharded"))


def _rank_file(rank: int) -> str:
    return f"rank_{rank}.pt"


_POLICY, _OBJECTIVE = "policy", "objective"


def _stateful(state: Checkpointable) -> tuple[torch.nn.Module, Any]:
    """The module whose parameters the optimizer holds, and the state-dict options.

    The objective's modules (PPO's critic) are trained by the same optimizer, so they are saved
    beside the policy: one module holding both. A LoRA run saves its trainable weights only (the
    frozen base comes from ``model.name_or_path``, as in a one-process LoRA checkpoint).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    lora = is_lora_model(state.model)
    options = StateDictOptions(ignore_frozen_params=lora, strict=not lora)
    modules = state.objective.modules()
    if not modules:
        return state.model, options
    both = torch.nn.ModuleDict({_POLICY: state.model, _OBJECTIVE: torch.nn.ModuleDict(modules)})
    return both, options


def _model_optim_state(state: Checkpointable) -> dict[str, dict]:
    """What DCP saves: ``model`` (the policy's weights, under their own names), ``objective``
    (its modules' weights; empty when it has none) and ``optim``."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    module, options = _stateful(state)
    weights, optim = get_state_dict(module, state.optimizer, options=options)
    if options.ignore_frozen_params:
        # a frozen weight tied to another (lm_head to the embeddings) can slip through
        trainable = {n for n, p in module.named_parameters() if p.requires_grad}
        weights = {k: v for k, v in weights.items() if k in trainable}
    if module is state.model:
        return {"model": weights, _OBJECTIVE: {}, "optim": optim}
    split: dict[str, dict] = {_POLICY: {}, _OBJECTIVE: {}}
    for key, value in weights.items():
        part, name = key.split(".", 1)
        split[part][name] = value
    return {"model": split[_POLICY], _OBJECTIVE: split[_OBJECTIVE], "optim": optim}


def _set_model_optim_state(state: Checkpointable, loaded: dict[str, dict]) -> None:
    from torch.distributed.checkpoint.state_dict import set_state_dict

    module, options = _stateful(state)
    weights = dict(loaded["model"])
    if module is not state.model:
        weights = {f"{_POLICY}.{k}": v for k, v in loaded["model"].items()}
        weights.update({f"{_OBJECTIVE}.{k}": v for k, v in loaded[_OBJECTIVE].items()})
    set_state_dict(
        module,
        state.optimizer,
        model_state_dict=weights,
        optim_state_dict=loaded["optim"],
        options=options,
    )


def _all_ok(ok: bool) -> bool:
    """True on every rank when ``ok`` is true on every rank."""
    flag = torch.tensor([0 if ok else 1])
    dist.all_reduce(flag)
    return int(flag.item()) == 0


def save_sharded_checkpoint(
    state: Checkpointable,
    run_dir: Path,
    *,
    tokenizer: Any,
    config_yaml: str,
    extra: dict | None = None,
    keep: int = 2,
    protect: Iterable[int] = (),
) -> Path:
    """Every rank calls this; each writes its shard into rank 0's ``run_dir``. Returns the final
    folder on every rank."""
    import torch.distributed.checkpoint as dcp

    rank = dist.get_rank()
    # other ranks keep their run files in a scratch folder: the checkpoint goes into rank 0's run
    shared = [str(run_dir)]
    dist.broadcast_object_list(shared, src=0)
    run_dir = Path(shared[0])
    folder = checkpoints_dir(run_dir)
    final = folder / checkpoint_name(state.step)
    tmp = folder / (TMP_PREFIX + final.name)
    error: BaseException | None = None
    if rank == 0:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            (tmp / MODEL_DIR).mkdir(parents=True)
        except Exception as exc:
            error = exc
    if _all_ok(error is None):
        tensors, plain = capture_state(state, extra)
        sharded = _model_optim_state(state)
        try:
            dcp.save(sharded, checkpoint_id=str(tmp / DCP_DIR))
            with open(tmp / _rank_file(rank), "wb") as f:
                torch.save({"rng": tensors["rng"], "rng_plain": json.dumps(plain["rng"])}, f)
            if rank == 0:
                state.model.config.save_pretrained(tmp / MODEL_DIR)
                _save_adapter_config(state.model, tmp / MODEL_DIR)
                if tokenizer is not None:
                    tokenizer.save_pretrained(tmp / MODEL_DIR)
                with open(tmp / TENSOR_STATE, "wb") as f:
                    # the objective's modules are sharded like the policy: they are in dcp/
                    torch.save({k: tensors[k] for k in ("scheduler", "rng")}, f)
                (tmp / PLAIN_STATE).write_text(json.dumps(plain))
                (tmp / CONFIG_FILE).write_text(config_yaml)
        except Exception as exc:
            error = exc
    if _all_ok(error is None) and rank == 0:
        try:
            sizes = _fsync_tree(tmp)
            manifest = {
                "format": FORMAT_VERSION,
                "step": state.step,
                "time": time.time(),
                "sharded": dist.get_world_size(),
                "files": sizes,
            }
            with open(tmp / COMPLETE, "w") as f:
                f.write(json.dumps(manifest, indent=1))
                f.flush()
                os.fsync(f.fileno())
            _fsync_path(tmp)
            if final.exists():
                _remove_checkpoint(final)
            tmp.rename(final)
            _fsync_path(folder)
            rotate_checkpoints(run_dir, keep, protect)
        except Exception as exc:
            error = exc
    if not _all_ok(error is None):
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        previous = latest_checkpoint(run_dir)
        usable = previous.path if previous else "none (this was the first save)"
        cause = _os_cause(error) if error is not None else "another rank failed"
        raise CheckpointError(
            f"could not write the sharded checkpoint of step {state.step} to {final} "
            f"(rank {rank}): {cause}. The newest usable checkpoint is still {usable}. "
            f"Free disk space, then resume with `rlvr train --resume {run_dir}`."
        ) from error
    return final


def restore_sharded_checkpoint(state: Checkpointable, path: Path) -> dict:
    """Every rank calls this: the sharded counterpart of ``checkpoint.restore_checkpoint``."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    manifest = read_marker(path) or {}
    world = dist.get_world_size()
    if int(manifest.get("sharded", 0)) != world:
        raise CheckpointError(
            f"{path} was written by {manifest.get('sharded')} processes, this run has {world}: "
            "resume with the same number of processes (or export it with `rlvr eval`/`rlvr merge`)"
        )
    tensors, plain = read_state(path)
    loaded = _model_optim_state(state)
    try:
        dcp.load(loaded, checkpoint_id=str(path / DCP_DIR))
    except Exception as exc:  # DCP names the missing keys (another objective, LoRA shape, ...)
        raise CheckpointError(f"{path}: the sharded state does not fit this run: {exc}") from exc
    _set_model_optim_state(state, loaded)
    restore_train_counters(state, tensors, plain, path, objective=False)
    mine = torch.load(path / _rank_file(dist.get_rank()), map_location="cpu", weights_only=True)
    set_rng_state(json.loads(mine["rng_plain"]), mine["rng"])
    return plain["extra"]


def full_model_state(path: Path, part: str = "model") -> dict[str, torch.Tensor]:
    """The full (unsharded) model weights of a sharded checkpoint, in one process (``part``
    ``"objective"``: the objective's modules, e.g. ``value_head.weight``)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path = Path(path)
    if not is_sharded(path):
        raise CheckpointError(f"{path} is not a complete sharded checkpoint")
    scratch = path.parent / f"{TMP_PREFIX}export-{path.name}-{os.getpid()}.pt"
    try:
        dcp_to_torch_save(str(path / DCP_DIR), str(scratch))
        saved = torch.load(scratch, map_location="cpu", weights_only=True)
    finally:
        scratch.unlink(missing_ok=True)
    return saved[part]


def _save_adapter_config(model: torch.nn.Module, folder: Path) -> None:
    """A LoRA run: ``adapter_config.json`` beside the model config, as ``save_pretrained`` of
    the adapter writes it (the export turns the sharded adapter weights into a peft folder)."""

    if is_lora_model(model):
        peft_cfg = copy.deepcopy(model.peft_config[ADAPTER_NAME])
        peft_cfg.inference_mode = True
        peft_cfg.save_pretrained(str(folder))


def _export_adapter(path: Path, out: Path) -> Path:
    """The LoRA adapter of a sharded checkpoint as a peft folder (``adapter_config.json``,
    ``adapter_model.safetensors``, tokenizer): peft names the weights, on a base model built
    on the meta device (no base weights are read or allocated)."""
    from peft import PeftConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    weights = full_model_state(path)
    peft_cfg = PeftConfig.from_pretrained(str(path / MODEL_DIR))
    peft_cfg.inference_mode = False  # trainable adapters: their names are the expected keys
    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path / MODEL_DIR))
    base.name_or_path = peft_cfg.base_model_name_or_path  # the recorded base, not model/
    model = get_peft_model(base, peft_cfg)
    expected = {n for n, p in model.named_parameters() if p.requires_grad}
    if set(weights) != expected:
        raise CheckpointError(
            f"{path}: the sharded adapter does not fit its adapter_config.json (only saved: "
            f"{sorted(set(weights) - expected)[:3]}, only expected: "
            f"{sorted(expected - set(weights))[:3]})"
        )
    tmp = out.parent / (TMP_PREFIX + out.name)
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), state_dict=weights)
    return _finish_export(path, tmp, out, skip=("config.json",))


def _finish_export(path: Path, tmp: Path, out: Path, skip: tuple[str, ...] = ()) -> Path:
    for f in (path / MODEL_DIR).iterdir():  # tokenizer files
        if f.is_file() and f.name not in skip and not (tmp / f.name).exists():
            shutil.copy2(f, tmp / f.name)
    open_up_files(tmp)  # safetensors writes weights owner-only
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def export_full_model(path: Path, out: Path | None = None) -> Path:
    """Write an HF folder (config, tokenizer, full weights; or a LoRA run's adapter folder) of a
    sharded checkpoint, by default ``path/full_model``; returns it. Runs in one process."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    out = Path(out) if out is not None else path / FULL_MODEL_DIR
    if any(out.glob("*.safetensors")) and any(
        (out / f).exists() for f in ("config.json", ADAPTER_CONFIG)
    ):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    if (path / MODEL_DIR / ADAPTER_CONFIG).exists():
        return _export_adapter(path, out)
    weights = full_model_state(path)
    config = AutoConfig.from_pretrained(path / MODEL_DIR)
    model = AutoModelForCausalLM.from_config(config)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if k not in (getattr(model, "all_tied_weights_keys", None) or {})]
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: the sharded weights do not fit the model "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    tmp = out.parent / (TMP_PREFIX + out.name)
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    return _finish_export(path, tmp, out)
