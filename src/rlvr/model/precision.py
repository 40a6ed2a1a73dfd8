"""Which precision the policy computes in: bf16 where the device has a fast path for it."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from rlvr.config import Config


def bf16_supported(device: torch.device | str = "cpu") -> bool:
    """True when bfloat16 matmuls are a fast path on this device."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        try:
            flags = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
        has = "avx512_bf16" in flags or "amx_bf16" in flags
        return has and onednn_isa_allows_bf16(os.environ.get("ONEDNN_MAX_CPU_ISA", ""))
    return False


# oneDNN's instruction-set caps (ONEDNN_MAX_CPU_ISA) that still include bf16 dot products
ONEDNN_BF16_ISAS = (
    "AVX512_CORE_BF16",
    "AVX512_CORE_AMX",
    "AVX512_CORE_AMX_FP16",
    "AVX10_1_512",
    "AVX10_1_512_AMX",
    "AVX10_1_512_AMX_FP16",
    "ALL",
)


def onednn_isa_allows_bf16(cap: str) -> bool:
    """False when ``ONEDNN_MAX_CPU_ISA`` caps oneDNN below bf16 (e.g. ``AVX2``): its bf16
    matmuls are then emulated and slower than float32, as on a CPU without the instructions."""
    return not cap or cap.upper() in ONEDNN_BF16_ISAS


def resolve_autocast(cfg: Config, device: torch.device) -> bool:
    """bf16 autocast on when asked, or on 'auto' where the device has a bf16 fast path."""
    return cfg.model.autocast == "bf16" or (cfg.model.autocast == "auto" and bf16_supported(device))


def precision_text(cfg: Config, autocast: bool, device: torch.device) -> str:
    """Which precision the forward passes use and why, for the run's first line.

    On a CPU without AVX512-BF16 or AMX (AVX2 only) bf16 matmuls are emulated and slower than
    float32, so ``model.autocast=auto`` trains in float32 there and says so.
    """
    why = f"model.autocast={cfg.model.autocast}"
    if cfg.model.autocast == "auto":
        fast = "has a" if autocast else "has no"
        why += f": this {torch.device(device).type.upper()} {fast} bf16 fast path"
    return f"{'bf16 autocast' if autocast else 'float32'} ({why})"


def weights_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of the model's first floating-point parameter."""
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32
