"""The `model.lora` section of the run config."""

from __future__ import annotations

from pydantic import Field

from rlvr.config_base import Section


class LoraConfig(Section):
    enabled: bool = Field(False, description="Train LoRA adapters instead of all weights.")
    rank: int = Field(16, gt=0, description="LoRA rank r.")
    alpha: int = Field(32, gt=0, description="LoRA alpha (scale = alpha / rank).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA path.")
    target_modules: list[str] | str = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="Module names to adapt; attention projections by default, or 'all-linear'.",
    )
