"""The `model.lora` section of the run config."""

from __future__ import annotations

from pydantic import Field, field_validator

from rlvr.config.base import Section

ALL_LINEAR = "all-linear"
ATTENTION_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj"]


class LoraConfig(Section):
    enabled: bool = Field(False, description="Train LoRA adapters instead of all weights.")
    rank: int = Field(16, gt=0, description="LoRA rank r.")
    alpha: int = Field(32, gt=0, description="LoRA alpha (scale = alpha / rank).")
    dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Dropout on the LoRA path, in the update's forward only (rollouts and the "
        "step's old and reference log-probs run without it).",
    )
    target_modules: list[str] | str = Field(
        default_factory=lambda: list(ATTENTION_PROJECTIONS),
        description="Module names to adapt; attention projections by default, or 'all-linear'.",
    )

    @field_validator("target_modules")
    @classmethod
    def _check_targets(cls, value: list[str] | str) -> list[str] | str:
        # peft reads any other string as a regular expression; a typo there adapts nothing or
        # everything without a word, so the only string accepted is the 'all-linear' keyword.
        if isinstance(value, str):
            if value != ALL_LINEAR:
                raise ValueError(
                    f"model.lora.target_modules={value!r}: give a list of module names "
                    f"(e.g. {ATTENTION_PROJECTIONS}) or {ALL_LINEAR!r}"
                )
            return value
        if not value:
            raise ValueError("model.lora.target_modules is empty: name at least one module")
        return value
