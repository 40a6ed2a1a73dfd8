"""`rlvr merge`: fold a LoRA checkpoint's adapter into its base model and save a plain HF model.

    rlvr merge runs/NAME                                    # its final adapter (else newest checkpoint)
    rlvr merge runs/NAME/checkpoints/step_000020            # -> runs/NAME/merged/step_000020
    rlvr merge runs/NAME/final --out /data/merged/NAME      # a LoRA run's final adapter

The base model is the checkpoint's ``model.name_or_path`` (from the ``config.yaml`` beside it, or
the run's), or ``--base`` when the checkpoint was copied away from the machine it was made on.
The merged folder carries its run: ``rlvr_run.json`` (the run directory and the checkpoint) and
``rlvr_config.yaml`` (the run's config), so `rlvr eval MERGED` grades with the run's data fields,
template, rewards and token limits wherever the folder is copied.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from rlvr.checkpoint.full import CONFIG_FILE, MODEL_DIR, checkpoint_step, latest_checkpoint
from rlvr.checkpoint.sharded import export_full_model, is_sharded
from rlvr.jsonio import atomic_write_text
from rlvr.model.loading import resolve_model_path, save_model_folder
from rlvr.model.lora import peft_wrap

ADAPTER_CONFIG = "adapter_config.json"


RUN_FILE = "rlvr_run.json"
RUN_CONFIG = "rlvr_config.yaml"
RUN_MARKERS = ("metrics.jsonl", "status.json")  # = rlvr.eval.loading.RUN_MARKERS


def _is_run_dir(path: Path) -> bool:
    return (path / CONFIG_FILE).is_file() and any((path / m).exists() for m in RUN_MARKERS)


def merge_source(path: Path) -> Path:
    """What ``rlvr merge PATH`` merges: a run directory's ``final/`` adapter, else its newest
    complete checkpoint; any other path as it is."""
    path = Path(path)
    if not _is_run_dir(path):
        return path
    if (path / "final" / ADAPTER_CONFIG).exists():
        return path / "final"
    latest = latest_checkpoint(path)
    if latest is not None:
        return latest.path
    if (path / "final" / "config.json").exists():
        raise ValueError(
            f"{path} is a full fine-tuning run: its final/ model is already a plain HF model "
            "(use it directly)"
        )
    raise FileNotFoundError(f"run directory {path} has no final/ adapter and no checkpoint")


def _run_config(path: Path) -> Path | None:
    """The config.yaml nearest to a checkpoint: its own, else its run's."""
    for folder in (path, path.parent, path.parent.parent):
        if (folder / CONFIG_FILE).exists():
            return folder / CONFIG_FILE
    return None


def _run_files(source: Path) -> dict[str, str]:
    """The files a merged folder carries: where it came from and the run's config."""
    cfg_file = _run_config(source.resolve())
    run = cfg_file.parent if cfg_file is not None and _is_run_dir(cfg_file.parent) else None
    record = {"run": str(run) if run else None, "merged_from": str(source.resolve())}
    files = {RUN_FILE: json.dumps(record, indent=1)}
    if cfg_file is not None:
        files[RUN_CONFIG] = cfg_file.read_text()
    return files


def adapter_folder(path: Path) -> Path:
    """The folder holding ``adapter_config.json``: ``path/model`` for a checkpoint, else ``path``."""
    path = Path(path)
    if (path / MODEL_DIR).is_dir():
        checkpoint_step(path)  # refuses a torn checkpoint
        path = path / MODEL_DIR
    if not (path / ADAPTER_CONFIG).exists():
        if (path / "config.json").exists():
            raise ValueError(
                f"{path} holds full model weights, not a LoRA adapter: it is already a "
                "merged HF model (use it directly)"
            )
        raise FileNotFoundError(f"no LoRA adapter ({ADAPTER_CONFIG}) in {path}")
    return path


def _model_config(path: Path) -> dict:
    """The ``model`` section of the nearest config.yaml: the checkpoint's own, else the run's."""
    cfg_file = _run_config(Path(path))
    return (yaml.safe_load(cfg_file.read_text()) or {}).get("model", {}) if cfg_file else {}


def default_out(path: Path) -> Path:
    """``RUN_DIR/merged/<name>`` for ``RUN_DIR/checkpoints/<name>`` or ``RUN_DIR/<name>``."""
    path = Path(path).resolve()
    run_dir = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    return run_dir / "merged" / path.name


def merge_checkpoint(path: Path, out: Path | None = None, base: str | None = None) -> Path:
    """Write the merged model (+ tokenizer) of the LoRA checkpoint or adapter folder ``path``
    (a sharded FSDP2 checkpoint: its full weights gathered into one HF folder, or its LoRA
    adapter gathered, then merged).

        The output is written under a temporary name and renamed, and an existing ``out`` is refused.
        Returns the output folder.
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = merge_source(Path(path))
    sharded = Path(path).is_dir() and is_sharded(Path(path))
    if sharded and not (Path(path) / MODEL_DIR / ADAPTER_CONFIG).exists():
        # FSDP2 shards of full weights -> one full HF model
        out = Path(out) if out is not None else default_out(Path(path))
        if out.exists():
            raise FileExistsError(f"{out} exists; remove it or pick another --out")
        export_full_model(Path(path), out)
        for name, text in _run_files(Path(path)).items():
            atomic_write_text(out / name, text)
        return out
    # a LoRA run's sharded checkpoint: its adapter is exported to step_N/full_model, then merged
    adapter = export_full_model(Path(path)) if sharded else adapter_folder(path)
    model_cfg = _model_config(Path(path))
    base = base or model_cfg.get("name_or_path")
    if not base:
        raise ValueError(f"no base model known for {path}: pass --base (a folder or hub id)")
    out = Path(out) if out is not None else default_out(Path(path))
    if out.exists():
        raise FileExistsError(f"{out} exists; remove it or pick another --out")
    dtype = torch.bfloat16 if model_cfg.get("dtype") == "bfloat16" else torch.float32
    base_path = resolve_model_path(base)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype)
    merged = peft_wrap(PeftModel.from_pretrained, model, str(adapter)).merge_and_unload()
    tok_source = adapter if (adapter / "tokenizer_config.json").exists() else base_path
    tokenizer = AutoTokenizer.from_pretrained(tok_source)
    return save_model_folder(merged, tokenizer, out, extra_files=_run_files(Path(path)))
