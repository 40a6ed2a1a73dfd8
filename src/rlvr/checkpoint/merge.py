"""`rlvr merge`: fold a LoRA checkpoint's adapter into its base model and save a plain HF model.

    rlvr merge runs/NAME/checkpoints/step_000020            # -> runs/NAME/merged/step_000020
    rlvr merge runs/NAME/final --out /data/merged/NAME      # a LoRA run's final adapter

The base model is the checkpoint's ``model.name_or_path`` (from the ``config.yaml`` beside it, or
the run's), or ``--base`` when the checkpoint was copied away from the machine it was made on.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from rlvr.checkpoint.full import CONFIG_FILE, MODEL_DIR, checkpoint_step
from rlvr.checkpoint.sharded import export_full_model, is_sharded
from rlvr.model.loading import resolve_model_path, save_model_folder
from rlvr.model.lora import peft_wrap

ADAPTER_CONFIG = "adapter_config.json"


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
    path = Path(path)
    for folder in (path, path.parent, path.parent.parent):
        cfg_file = folder / CONFIG_FILE
        if cfg_file.exists():
            return (yaml.safe_load(cfg_file.read_text()) or {}).get("model", {})
    return {}


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

    sharded = Path(path).is_dir() and is_sharded(Path(path))
    if sharded and not (Path(path) / MODEL_DIR / ADAPTER_CONFIG).exists():
        # FSDP2 shards of full weights -> one full HF model
        out = Path(out) if out is not None else default_out(Path(path))
        if out.exists():
            raise FileExistsError(f"{out} exists; remove it or pick another --out")
        return export_full_model(Path(path), out)
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
    return save_model_folder(merged, tokenizer, out)
