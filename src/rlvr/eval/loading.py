"""Find and load what an offline evaluation points at, with the run's own settings.

`rlvr eval` and `rlvr data filter-difficulty` accept a run directory (its ``final/`` model and
``config.yaml``), a folder inside one (``RUN/final``, ``RUN/best``, a checkpoint
``RUN/checkpoints/step_N``), a model folder, a saved LoRA adapter folder, a ``.gguf`` file or a hub id. A LoRA adapter is loaded on
its base model with peft, unmerged, exactly as training ran it. The base comes from ``--base``,
else the path recorded in ``adapter_config.json`` when it exists here, else the run config's
``model.name_or_path``, so a run directory copied to another machine still evaluates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from rlvr.checkpoint.merge import RUN_CONFIG as MERGED_RUN_CONFIG
from rlvr.checkpoint.merge import RUN_FILE as MERGED_RUN_FILE
from rlvr.checkpoint.sharded import export_full_model, is_sharded
from rlvr.distributed import DistInfo, device_for
from rlvr.eval.engine import offline_eval_engine
from rlvr.model.attention import use_training_attention
from rlvr.model.loading import ModelLoadError, prepare_tokenizer
from rlvr.model.lora import peft_wrap
from rlvr.model.vlm import load_policy_model, load_processor

RUN_MARKERS = ("metrics.jsonl", "status.json")
ADAPTER_CONFIG = "adapter_config.json"
CHECKPOINT_MODEL = "model"  # rlvr.checkpoint.full.MODEL_DIR


@dataclass(frozen=True)
class ModelSource:
    """model: the folder, file or hub id to load; run_dir: the run whose config applies."""

    model: str
    run_dir: Path | None
    is_adapter: bool
    config_path: Path | None = None  # a merged folder's own copy of its run's config

    @property
    def config_file(self) -> Path | None:
        """The config whose data fields, template, rewards and limits the evaluation uses."""
        return self.run_dir / "config.yaml" if self.run_dir else self.config_path


def is_run_dir(path: Path) -> bool:
    return (path / "config.yaml").is_file() and any((path / m).exists() for m in RUN_MARKERS)


def find_run_dir(path: Path, levels: int = 3) -> Path | None:
    """``path`` or one of its ``levels`` nearest parents that is a run directory."""
    for candidate in [path, *list(path.parents)[:levels]]:
        if is_run_dir(candidate):
            return candidate
    return None


def resolve_source(model: str, run: str | None = None) -> ModelSource:
    """Work out what ``model`` names and which run directory (if any) describes it."""
    run_dir = Path(run).expanduser() if run else None
    if run_dir is not None and not (run_dir / "config.yaml").is_file():
        raise ValueError(f"--run {run_dir}: no config.yaml there (not a run directory)")
    path = Path(model).expanduser()
    if not path.exists():
        return ModelSource(model, run_dir, False)  # a hub id (or a path load will report)
    if path.is_dir() and is_sharded(path):
        path = export_full_model(path)  # a sharded (FSDP2) checkpoint -> step_N/full_model
    elif (path / CHECKPOINT_MODEL).is_dir() and not (path / "config.json").exists():
        path = path / CHECKPOINT_MODEL  # a training checkpoint: RUN/checkpoints/step_N/model
    if path.is_dir() and is_run_dir(path):
        final = path / "final"
        if not final.is_dir():
            status = path / "status.json"
            state = json.loads(status.read_text()).get("state") if status.exists() else "unknown"
            raise ValueError(
                f"run directory {path} has no final/ model (run state: {state}); "
                "name a checkpoint folder inside it instead"
            )
        return ModelSource(str(final), run_dir or path, (final / ADAPTER_CONFIG).exists())
    if path.is_dir() and not any((path / f).exists() for f in ("config.json", ADAPTER_CONFIG)):
        raise ModelLoadError(
            f"{path} is not a model folder (no config.json), a LoRA adapter folder (no "
            f"{ADAPTER_CONFIG}) or a run directory (no config.yaml + metrics.jsonl)"
        )
    run_dir = run_dir or find_run_dir(path.resolve().parent) or _merged_from_run(path)
    carried = path / MERGED_RUN_CONFIG if path.is_dir() else None
    return ModelSource(
        str(path),
        run_dir,
        path.is_dir() and (path / ADAPTER_CONFIG).exists(),
        carried if carried is not None and carried.is_file() else None,
    )


def _merged_from_run(path: Path) -> Path | None:
    """The run a merged folder names (``rlvr merge`` writes it), where it still exists here."""
    record = path / MERGED_RUN_FILE if path.is_dir() else None
    if record is None or not record.is_file():
        return None
    run = json.loads(record.read_text()).get("run")
    return Path(run) if run and is_run_dir(Path(run)) else None


def adapter_base(adapter_dir: Path, *, explicit: str | None, config_base: str | None) -> str:
    """The base model to load a LoRA adapter on (see the module docstring for the order)."""
    if explicit:
        return explicit
    recorded = json.loads((adapter_dir / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if recorded and Path(recorded).expanduser().exists():
        return recorded
    if config_base:
        return config_base
    if recorded:
        return recorded  # a hub id: works where the hub or its cache is reachable
    raise ValueError(f"LoRA adapter {adapter_dir} names no base model; pass --base MODEL")


def load_policy(
    source: ModelSource, cfg, *, base: str | None = None, config_given: bool = False
) -> tuple[torch.nn.Module, object, str | None, object | None]:
    """(model, tokenizer, base model used or None, a VLM's processor or None) in the config's
    dtype, on its device.

    ``train.threads`` applies here as in training (the same thread count keeps the arithmetic,
    and so greedy decoding, identical between the two).
    """
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    dtype = torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float32
    device = str(device_for(DistInfo(), cfg.model.device))
    if not source.is_adapter:
        if base:
            raise ValueError(f"--base is only for LoRA adapters; {source.model} is a full model")
        model, tokenizer, processor = load_policy_model(source.model, dtype=dtype, device=device)
        use_training_attention(model, cfg, device)
        return model, tokenizer, None, processor
    from peft import PeftModel
    from transformers import AutoTokenizer

    adapter = Path(source.model)
    base_name = adapter_base(
        adapter, explicit=base, config_base=cfg.model.name_or_path if config_given else None
    )
    try:
        model, tokenizer, processor = load_policy_model(base_name, dtype=dtype, device=device)
    except ModelLoadError as exc:
        raise ModelLoadError(f"base model of LoRA adapter {adapter}: {exc}; pass --base") from exc
    use_training_attention(model, cfg, device)
    model = peft_wrap(PeftModel.from_pretrained, model, str(adapter)).to(device)
    if processor is not None and (adapter / "processor_config.json").exists():
        processor = load_processor(adapter)  # the run saved its processor beside it
        tokenizer = prepare_tokenizer(processor.tokenizer)
    elif (adapter / "tokenizer_config.json").exists():  # the run saved its tokenizer beside it
        tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(str(adapter)))
    return model, tokenizer, base_name, processor


def eval_engine(cfg, model, tokenizer):
    """The rollout engine the run's config asks for, computing in ``eval.dtype`` (not the
    training autocast: see `rlvr.eval.engine`)."""

    return offline_eval_engine(cfg, model, tokenizer)
