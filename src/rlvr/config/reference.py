"""The configuration reference: every key with its default and meaning, generated from the
sections themselves (`rlvr config` prints it; docs/config.md is its Markdown, kept equal by a
test that regenerates it).

List items that are sections of their own (``reward.specs``, ``eval.sets``, ``eval.modes``) get
their keys as ``reward.specs[].name``.
"""

from __future__ import annotations

import json
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from rlvr.config.sections import Config

REQUIRED = "(required)"


def _item_model(annotation: Any) -> type[BaseModel] | None:
    """The section a list field holds (``list[RewardSpec]`` -> RewardSpec), None otherwise."""
    if typing.get_origin(annotation) is not list:
        return None
    for arg in typing.get_args(annotation):
        for inner in (arg, *typing.get_args(arg)):
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                return inner
    return None


def _section(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _default(field: Any) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return REQUIRED
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, list):  # a list of sections (eval.modes): as a config writes it
        value = [v.model_dump(mode="json") if isinstance(v, BaseModel) else v for v in value]
    return json.dumps(value, default=str)


def _values(section: BaseModel | None, name: str) -> Any:
    return getattr(section, name) if section is not None else None


def reference_rows(
    model: type[BaseModel] = Config, prefix: str = "", values: BaseModel | None = None
) -> list[tuple[str, str, str, str | None]]:
    """(dotted key, default, meaning, value in ``values`` or None) for every key of ``model``."""
    rows: list[tuple[str, str, str, str | None]] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        sub = _section(field.annotation)
        if sub is not None:
            rows += reference_rows(sub, key + ".", _values(values, name))
            continue
        value = None
        if values is not None:
            current = getattr(values, name)
            if isinstance(current, list):
                current = [
                    c.model_dump(mode="json") if isinstance(c, BaseModel) else c for c in current
                ]
            value = json.dumps(current, default=str)
        meaning = " ".join((field.description or "").split())
        rows.append((key, _default(field), meaning, value))
        item = _item_model(field.annotation)
        if item is not None:
            rows += [(k, d, m, None) for k, d, m, _ in reference_rows(item, key + "[].")]
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def reference_markdown() -> str:
    """The table of docs/config.md: one row per key, by section."""
    lines: list[str] = []
    section = None
    for key, default, meaning, _ in reference_rows():
        top = key.split(".")[0]
        if top != section:
            section = top
            lines += ["", f"### {section}", "", "| key | default | meaning |", "|---|---|---|"]
        lines.append(f"| `{key}` | `{_cell(default)}` | {_cell(meaning)} |")
    return "\n".join(lines).lstrip("\n") + "\n"


def reference_text(cfg: Config) -> str:
    """``key = value  (default D)  meaning`` for every key of ``cfg`` (`rlvr config`)."""
    out = []
    for key, default, meaning, value in reference_rows(values=cfg):
        if value is None:  # a list item's key: shown under its list
            out.append(f"  {key}  ({meaning})" if meaning else f"  {key}")
            continue
        mark = "" if value == default else f"   (default {default})"
        out.append(f"{key} = {value}{mark}" + (f"\n    {meaning}" if meaning else ""))
    return "\n".join(out)
