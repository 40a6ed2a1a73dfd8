"""Multimodal rows: images next to the prompt, rendered with the model's processor.

A row may carry ``images``: a list (or one item) of PIL images, file paths, raw encoded bytes, or
``{"bytes": ..., "path": ...}`` dicts (what a ``datasets`` Image column yields). The prompt text
is rendered with the processor's chat template, one ``{"type": "image"}`` entry per image before
the question, and the processor expands each image placeholder to its vision tokens and returns
the pixel values and image-grid metadata the model needs for the same prompt.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

IMAGE_FIELD = "images"


def row_images(row: dict, index: int) -> list:
    """The row's images as RGB PIL images; errors name the row and the field."""
    from PIL import Image

    raw = row.get(IMAGE_FIELD)
    if raw is None:
        return []
    items = raw if isinstance(raw, (list, tuple)) else [raw]
    out = []
    for j, item in enumerate(items):
        where = f"row {index}: field {IMAGE_FIELD!r}[{j}]"
        if isinstance(item, dict):
            item = item.get("bytes") or item.get("path")
        try:
            if isinstance(item, Image.Image):
                image = item
            elif isinstance(item, (bytes, bytearray)):
                image = Image.open(io.BytesIO(item))
            elif isinstance(item, (str, Path)):
                if str(item).startswith(("http://", "https://")):
                    raise ValueError("URLs are not fetched; give a path, bytes or a PIL image")
                image = Image.open(item)
            else:
                raise ValueError(
                    f"expected a PIL image, a path or bytes, got {type(item).__name__}"
                )
            out.append(image.convert("RGB"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None
    return out


def has_images(rows: list[dict]) -> bool:
    return any(r.get(IMAGE_FIELD) for r in rows)


def render_multimodal_prompt(
    processor, question: str, n_images: int, system_prompt: str | None = None
) -> str:
    """The chat text with ``n_images`` image entries before the question (placeholders unexpanded)."""
    if not getattr(processor, "chat_template", None):
        raise ValueError(
            "multimodal rows need a processor with a chat template (data.template=chat)"
        )
    content: list[dict] = [{"type": "image"} for _ in range(n_images)]
    content.append({"type": "text", "text": question})
    messages: list[dict[str, Any]] = [{"role": "user", "content": content}]
    if system_prompt:
        messages.insert(0, {"role": "system", "content": [{"type": "text", "text": system_prompt}]})
    return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def render_multimodal_rows(
    rows: list[dict], processor, system_prompt: str | None = None
) -> tuple[list[str], list[list[int]], list[dict[str, torch.Tensor]]]:
    """Texts, token ids (image placeholders expanded) and per-row vision inputs of ``rows``.

    Each row's vision inputs are the processor's own outputs for that row alone
    (``pixel_values`` and ``image_grid_thw`` for Qwen2-VL; empty for a row without images), so
    any batch of rows can later be concatenated in row order.
    """
    texts, ids, vision = [], [], []
    for i, row in enumerate(rows):
        if "prompt" not in row:
            raise ValueError(f"row {i}: no 'prompt' field")
        images = row_images(row, i)
        text = render_multimodal_prompt(
            processor, row["prompt"], len(images), row.get("system_prompt") or system_prompt
        )
        enc = processor(text=[text], images=images or None, return_tensors="pt")
        texts.append(text)
        ids.append(enc["input_ids"][0].tolist())
        vision.append({k: v for k, v in enc.items() if k in VISION_KEYS})
    return texts, ids, vision


VISION_KEYS = ("pixel_values", "image_grid_thw")


def collate_vision(vision: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Concatenate per-row vision inputs in row order (rows without images contribute nothing)."""
    out: dict[str, torch.Tensor] = {}
    for key in VISION_KEYS:
        parts = [v[key] for v in vision if key in v]
        if parts:
            out[key] = torch.cat(parts)
    return out
