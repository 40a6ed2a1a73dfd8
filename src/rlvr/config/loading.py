"""Reading a config: YAML file + dotted command-line overrides, unknown keys named with a hint.

cfg = load_config("run.yaml", ["algo.group_size=4", "train.lr=2e-6"])
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rlvr.config.base import ConfigError
from rlvr.config.sections import Config


def known_keys(model_cls: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model_cls.model_fields.items():
        dotted = f"{prefix}{name}"
        keys.append(dotted)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys.extend(known_keys(ann, dotted + "."))
    return keys


# Names users bring from TRL / OAT / OpenRLHF / verl, mapped to ours for the "did you mean" hint.
ALIASES = {
    "learning_rate": "train.lr",
    "lr_scheduler": "train.schedule",
    "lr_scheduler_type": "train.schedule",
    "num_samples": "algo.group_size",
    "num_generations": "algo.group_size",
    "n_samples_per_prompt": "algo.group_size",
    "kl_coef": "algo.beta",
    "init_kl_coef": "algo.beta",
    "kl_penalty_coef": "algo.beta",
    "generate_max_length": "rollout.max_new_tokens",
    "max_completion_length": "rollout.max_new_tokens",
    "max_tokens": "rollout.max_new_tokens",
    "generate_max_len": "rollout.max_new_tokens",
    "epsilon": "algo.clip_low",
    "epsilon_high": "algo.clip_high",
    "eps_clip": "algo.clip_low",
    "loss_type": "algo.objective",
    "adv_estimator": "algo.objective",
    "num_ppo_epochs": "algo.epochs_per_batch",
    "num_iterations": "algo.epochs_per_batch",
    "max_grad_norm": "train.max_grad_norm",
    "model": "model.name_or_path",
    "pretrain": "model.name_or_path",
    "prompt_template": "data.template",
    "max_steps": "train.max_steps",
    "seed": "train.seed",
    "warmup_steps": "train.warmup_steps",
    "beta": "algo.beta",
    "lora_rank": "model.lora.rank",
}


def _check_keys(data: dict, model_cls: type[BaseModel], prefix: str = "") -> None:
    """Raise ConfigError for the first unknown key, suggesting the closest valid dotted key."""
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in model_cls.model_fields:
            known = known_keys(model_cls, prefix)
            close = [ALIASES[key]] if key in ALIASES else []
            close = close or difflib.get_close_matches(dotted, known, n=1, cutoff=0.5)
            if not close:  # try the key alone against every leaf name anywhere in the config
                all_keys = known_keys(Config)
                leaf = {k.rsplit(".", 1)[-1]: k for k in all_keys}
                best = difflib.get_close_matches(key, list(leaf), n=1, cutoff=0.6)
                close = [leaf[best[0]]] if best else []
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown config key {dotted!r}{hint}")
        ann = model_cls.model_fields[key].annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel) and isinstance(value, dict):
            _check_keys(value, ann, dotted + ".")


def _parse_value(text: str) -> Any:
    """Parse an override's value as YAML (so 2e-6, true, [a, b] and null work)."""
    # YAML 1.1 reads "2e-6" as a string; numbers in exponent form are common in overrides.
    if re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", text):
        return float(text)
    # YAML 1.1 turns on/off/yes/no into booleans; keep them as words (pydantic still reads them
    # as booleans where a field is boolean, and `model.autocast=off` stays the word "off").
    if text.lower() in ("on", "off", "yes", "no", "y", "n"):
        return text
    return yaml.safe_load(text) if text != "" else ""


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``a.b.c=value`` overrides to a nested dict (in place) and return it."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        key, _, raw = item.partition("=")
        parts = key.strip().split(".")
        node = data
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
        node[parts[-1]] = _parse_value(raw.strip())
    return data


def _format_validation_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        lines.append(f"{loc}: {err['msg']} (got {err.get('input')!r})")
    return "invalid config value:\n  - " + "\n  - ".join(lines)


def config_from_dict(data: dict) -> Config:
    _check_keys(data, Config)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config (or the defaults when ``path`` is None) and apply dotted overrides."""
    data: dict = {}
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"config file {p} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {p} is not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(
                f"config file {p} must hold a mapping of sections, got {type(loaded).__name__}"
            )
        data = loaded or {}
    apply_overrides(data, overrides or [])
    return config_from_dict(data)
