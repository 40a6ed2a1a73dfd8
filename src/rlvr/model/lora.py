"""LoRA adapters through peft: wrap a causal LM, save and load only the adapter weights.

The reference policy of a LoRA run is the same module with its adapters switched off
(``model.disable_adapter()``), so KL against the base needs no second copy of the weights.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlvr.config.lora import ALL_LINEAR, LoraConfig

ADAPTER_WEIGHTS = "adapter_model.safetensors"
# transformers 5 renamed PreTrainedModel.is_gradient_checkpointing to is_activation_checkpointing
# and warns on every read of the old name; peft (up to 0.21.2) still reads it when it wraps or
# loads an adapter (PeftModel.__init__). The value it reads is right; only the warning is wrong.
_PEFT_READS_OLD_NAME = r"`is_gradient_checkpointing` is deprecated"


def peft_wrap(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` (get_peft_model, PeftModel.from_pretrained) without the
    FutureWarning peft's read of the deprecated name raises; every other warning passes."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_PEFT_READS_OLD_NAME, category=FutureWarning)
        return fn(*args, **kwargs)


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The distinct last name components of the model's ``nn.Linear`` modules, sorted."""
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear)
        }
    )


def apply_lora(model: torch.nn.Module, cfg: LoraConfig, exclude: list[str] | tuple = ()):
    """Freeze ``model`` and wrap it as a ``peft.PeftModel`` with trainable LoRA adapters.

    ``cfg.target_modules`` is a list of module names (matched against the last component of each
    module's dotted name) or ``'all-linear'`` (every linear layer but the output head). A name
    that matches no linear layer is an error listing the names that exist. Modules under the
    ``exclude`` prefixes (``model.freeze``: a VLM's vision tower) get no adapter.
    """
    import re

    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    if cfg.target_modules != ALL_LINEAR:
        known = linear_module_names(model)
        missing = [t for t in cfg.target_modules if t not in known]
        if missing:
            raise ValueError(
                f"model.lora.target_modules: {missing} match no linear layer of this model; "
                f"known: {known} (or {ALL_LINEAR!r})"
            )
    peft_cfg = PeftLoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=cfg.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
        # peft full-matches a string against each module name
        exclude_modules="|".join(f"{re.escape(p)}.*" for p in exclude) or None,
    )
    checkpointing = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5
    if checkpointing is None:
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    if checkpointing:
        # With frozen embeddings and re-entrant checkpointing no input of a checkpointed block
        # requires grad, so the adapters inside it would get no gradient at all.
        model.enable_input_require_grads()
    return peft_wrap(get_peft_model, model, peft_cfg)


def is_lora_model(model: torch.nn.Module) -> bool:
    """True when ``model`` is a ``peft.PeftModel``."""
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)


def load_adapter_weights(model: torch.nn.Module, folder: Path) -> None:
    """Copy the adapter saved in ``folder`` (by ``save_pretrained``) into the PeftModel ``model``.

    Raises ``ValueError`` when the saved adapter does not cover exactly the model's adapter
    weights (a different rank or target list would otherwise load partially and silently).
    """
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    path = Path(folder) / ADAPTER_WEIGHTS
    if not path.exists():
        raise FileNotFoundError(f"no LoRA adapter at {path}")
    saved = load_file(str(path))
    expected = set(get_peft_model_state_dict(model))
    if set(saved) != expected:
        only_saved = sorted(set(saved) - expected)[:5]
        only_model = sorted(expected - set(saved))[:5]
        raise ValueError(
            f"the adapter in {folder} does not match this model's LoRA layers "
            f"(only in the file: {only_saved}; only in the model: {only_model}); "
            "was model.lora changed since the checkpoint was written?"
        )
    result = set_peft_model_state_dict(model, saved)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"the adapter in {folder} has weights the model lacks: {unexpected[:5]}")
