"""``model.freeze``: parameters frozen by name prefix (a VLM's vision tower by default)."""

from __future__ import annotations

import torch

# Where transformers keeps the vision encoder of the supported VLM families (Qwen2-VL / Qwen2.5-VL
# under "model.visual"; LLaVA-style under "model.vision_tower").
VISION_PREFIXES = ("model.visual.", "visual.", "model.vision_tower.", "vision_tower.")


def default_freeze(model: torch.nn.Module) -> list[str]:
    """The vision-tower prefixes present in ``model`` (none for a text model)."""
    names = [n for n, _ in model.named_parameters()]
    return [p for p in VISION_PREFIXES if any(n.startswith(p) for n in names)]


def freeze_prefixes(model: torch.nn.Module, prefixes: list[str]) -> dict[str, int]:
    """Turn off ``requires_grad`` for every parameter whose name starts with a prefix.

    A prefix that matches no parameter is an error naming it (a typo would train the tower).
    Returns ``{"params_trainable": ..., "params_total": ...}`` counted in elements.
    """
    named = list(model.named_parameters())
    for prefix in prefixes:
        if not any(n.startswith(prefix) for n, _ in named):
            tops = sorted({".".join(n.split(".")[:2]) for n, _ in named})
            raise ValueError(
                f"model.freeze: prefix {prefix!r} matches no parameter; top-level names: {tops}"
            )
    for name, param in named:
        if any(name.startswith(p) for p in prefixes):
            param.requires_grad_(False)
    return parameter_counts(model)


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    params = list(model.parameters())
    return {
        "params_trainable": sum(p.numel() for p in params if p.requires_grad),
        "params_total": sum(p.numel() for p in params),
    }
