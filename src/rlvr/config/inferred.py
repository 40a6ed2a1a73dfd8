"""Settings that follow from other knobs when the config leaves them out, each said on the run's
first lines (`Config.inferred()`), so a run never quietly does something other than what was
written:

- ``data.task=file`` where ``data.train_path`` or ``data.eval_path`` is given without a task (a
  data path means "use it"; an explicit other task with a path is a contradiction, refused in
  `rlvr.config.validate`);
- ``train.lr=LORA_LR`` where LoRA is on and the config sets no learning rate: the full
  fine-tuning default barely moves adapters.

Read from the raw mapping before validation: only what the YAML or the overrides name counts as
given (a section object's explicitly set fields, where one is passed instead).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

FULL_FT_LR = 2e-5  # TrainConfig.lr's default
# LoRA wants a learning rate about 10x full fine-tuning's: TRL's "LoRA Without Regret" guide
# (trl docs/source/lora_without_regret.md) runs GRPO at 1e-5 with LoRA against 1e-6 for full
# fine-tuning; its Python example uses 5e-5; peft/TRL LoRA examples sit in 1e-5..2e-4.
LORA_LR = 10 * FULL_FT_LR
DATA_PATHS = ("train_path", "eval_path")
_TRUE = ("true", "on", "yes", "y", "1")


def _given(section: Any) -> dict:
    if isinstance(section, BaseModel):
        return section.model_dump(exclude_unset=True)
    return section if isinstance(section, dict) else {}


def _truthy(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() in _TRUE)


def infer(data: Any) -> tuple[Any, dict[str, str]]:
    """The raw config mapping ``data`` with the inferred settings filled in, and what was
    inferred: dotted key -> the sentence that announces it."""
    if not isinstance(data, dict):
        return data, {}
    notes: dict[str, str] = {}
    out = dict(data)
    d = _given(out.get("data"))
    paths = [k for k in DATA_PATHS if d.get(k)]
    if paths and "task" not in d:
        out["data"] = {**d, "task": "file"}
        notes["data.task"] = (
            f"data.task=file (inferred from data.{paths[0]}: the rows come from the file)"
        )
    model = _given(out.get("model"))
    lora = _given(model.get("lora"))
    train = _given(out.get("train"))
    if _truthy(lora.get("enabled")) and "lr" not in train:
        out["train"] = {**train, "lr": LORA_LR}
        notes["train.lr"] = (
            f"train.lr={LORA_LR:g} (LoRA default: 10x the full fine-tuning default "
            f"{FULL_FT_LR:g}, the ratio of TRL's LoRA guide for GRPO; set train.lr to choose)"
        )
    return out, notes
