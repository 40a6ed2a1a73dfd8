"""Reading a config: YAML file + dotted command-line overrides, unknown keys named with a hint.

cfg = load_config("run.yaml", ["algo.group_size=4", "train.lr=2e-6"])
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from rlvr.config.base import ConfigError
from rlvr.config.peer_names import PEER_NAMES, near_miss, unknown_key_message
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


# The peers' names mapped to ours (rlvr.config.peer_names); kept under this name for importers.
ALIASES = {name: key for name, (key, _) in PEER_NAMES.items() if key is not None}


def _leaves(value: Any, prefix: str) -> list[str]:
    """The dotted leaf keys under ``prefix`` of a nested mapping (``prefix`` itself if not one)."""
    if not isinstance(value, dict) or not value:
        return [prefix]
    return [leaf for k, v in value.items() for leaf in _leaves(v, f"{prefix}.{k}")]


def _check_keys(data: dict, model_cls: type[BaseModel], prefix: str = "") -> None:
    """Raise ConfigError for the first unknown key: what a peer framework means by it, or the
    valid key it is a typo of (rlvr.config.peer_names)."""
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in model_cls.model_fields:
            leaves = _leaves(value, dotted) if isinstance(value, dict) else []
            raise ConfigError(
                unknown_key_message(
                    dotted, leaves, list(model_cls.model_fields), known_keys(Config)
                )
            )
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


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The config model that holds the key at ``loc`` (list positions skipped): the model of
    ``reward.specs[0]`` for ``("reward", "specs", 0, "weigth")``."""
    model: type[BaseModel] = Config
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        ann = field.annotation
        inner = [ann, *get_args(ann), *(a for x in get_args(ann) for a in get_args(x))]
        found = [a for a in inner if isinstance(a, type) and issubclass(a, BaseModel)]
        if not found:
            return None
        model = found[0]
    return model


# A section given one value: the key that value most likely belongs to.
_SECTION_VALUE = {("model",): "model.name_or_path", ("data",): "data.train_path"}


def _mapping_hint(err: Any) -> str:
    """How to write a plain value where a mapping belongs: ``model=NAME`` (the key it means),
    or a reward named alone in ``reward.specs`` (TRL's reward_funcs is a list of names)."""
    value, loc = err.get("input"), tuple(err["loc"])
    if err["type"] != "model_type" or not isinstance(value, str | int | float):
        return ""
    if loc in _SECTION_VALUE:
        return f"; did you mean '{_SECTION_VALUE[loc]}={value}'?"
    if loc[:2] == ("reward", "specs"):
        return f"; a spec is a mapping: write it as {{name: {str(value)!r}}}"
    return ""


def _format_validation_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = [f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]]
        loc = "".join(where).lstrip(".")
        model = _model_at(err["loc"]) if err["type"] == "extra_forbidden" else None
        if model is not None:  # a typo inside a list item (a reward spec): say what it may be
            key, known = str(err["loc"][-1]), list(model.model_fields)
            close = near_miss(key, known)
            hint = f"; did you mean {close!r}?" if close else ""
            at = "".join(where[:-1]).lstrip(".")
            lines.append(f"{at}: unknown key {key!r}{hint} (known: {', '.join(known)})")
            continue
        lines.append(f"{loc}: {err['msg']} (got {err.get('input')!r}){_mapping_hint(err)}")
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
