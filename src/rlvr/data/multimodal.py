"""Multimodal rows: images next to the prompt, rendered with the model's processor.

A row may carry ``images``: a list (or one item) of PIL images, file paths, raw encoded bytes, or
``{"bytes": ..., "path": ...}`` dicts (what a ``datasets`` Image column yields). The prompt text
is rendered with the processor's chat template, one ``{"type": "image"}`` entry per image before
the question, and the processor expands each image placeholder to its vision tokens and returns
the pixel values and image-grid metadata the model needs for the same prompt.

``render_inputs`` is the one entry point of training, evaluation and the prompt-length check:
text rows go through ``templates.render_rows``, rows with images through the processor.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlvr.data.templates import render_rows

IMAGE_FIELD = "images"
VISION_KEYS = ("pixel_values", "image_grid_thw")
# Config fields naming a VLM's vision special tokens (Qwen2-VL / Qwen2.5-VL names).
VISION_TOKEN_FIELDS = (
    "image_token_id",
    "video_token_id",
    "vision_start_token_id",
    "vision_end_token_id",
)


def vision_token_ids(config) -> list[int]:
    """The vision special tokens of a VLM's config (none for a text model). A reply must never
    hold one: the model would take it for an image placeholder in the next forward pass and
    refuse the batch (image features and image tokens would not match), so engines never
    sample them."""
    ids = (getattr(config, name, None) for name in VISION_TOKEN_FIELDS)
    return sorted({i for i in ids if isinstance(i, int)})


@dataclass
class PromptVision:
    """One prompt's images and the processor's tensors for that prompt alone.

    ``inputs`` (``pixel_values``, ``image_grid_thw``; empty for a prompt without images) is what
    the hf engine and the trainer's log-prob passes feed the model, concatenated in row order;
    ``images`` (RGB PIL, in prompt order) are the images themselves, for an engine that takes raw
    images (vLLM's ``multi_modal_data``: not wired, see docs/vlm.md).
    """

    images: list
    inputs: dict[str, torch.Tensor]


def row_images(row: dict, index: int, *, convert: bool = True) -> list:
    """The row's images as RGB PIL images (``convert=False``: as opened, pixels not decoded yet,
    for their sizes); errors name the row and the field."""
    from PIL import Image

    raw = row.get(IMAGE_FIELD)
    if raw is None:
        return []
    items = raw if isinstance(raw, (list, tuple)) else [raw]
    out = []
    name = row.get("_source") or f"row {index}"  # a file's rows name their line
    for j, item in enumerate(items):
        where = f"{name}: field {IMAGE_FIELD!r}[{j}]"
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
            out.append(image.convert("RGB") if convert else image)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None
    return out


def resolve_image_paths(row: dict, base: Path) -> list[str]:
    """Make a data file's relative image paths relative to the file's folder (in place);
    returns the paths that name no file."""

    def fix(item):
        if isinstance(item, str) and "://" not in item and not Path(item).is_absolute():
            return str(Path(base) / item)
        return item

    raw = row.get(IMAGE_FIELD)
    if raw is None:
        return []
    row[IMAGE_FIELD] = [fix(i) for i in raw] if isinstance(raw, list) else fix(raw)
    items = row[IMAGE_FIELD] if isinstance(raw, list) else [row[IMAGE_FIELD]]
    return [i for i in items if isinstance(i, str) and "://" not in i and not Path(i).is_file()]


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
) -> tuple[list[str], list[list[int]], list[PromptVision]]:
    """Texts, token ids (image placeholders expanded) and per-row vision of ``rows``.

    Each row's vision inputs are the processor's own outputs for that row alone, so any batch of
    rows can later be concatenated in row order (``collate_vision``).
    """
    texts, ids, vision = [], [], []
    for i, row in enumerate(rows):
        if "prompt" not in row:
            raise ValueError(f"row {i}: no 'prompt' field")
        images = row_images(row, i)
        text = render_multimodal_prompt(
            processor, row["prompt"], len(images), row.get("system_prompt") or system_prompt
        )
        # no special tokens added: the chat text holds them, as on the text path (render_rows)
        enc = processor(
            text=[text], images=images or None, return_tensors="pt", add_special_tokens=False
        )
        texts.append(text)
        ids.append(enc["input_ids"][0].tolist())
        vision.append(PromptVision(images, {k: v for k, v in enc.items() if k in VISION_KEYS}))
    return texts, ids, vision


def render_inputs(
    rows: list[dict],
    template: str,
    tokenizer,
    system_prompt: str | None = None,
    processor=None,
) -> tuple[list[str], list[list[int]], list[PromptVision] | None]:
    """Prompt texts, token ids and per-row vision (None for text rows) of dataset rows.

    Rows with images need the model's ``processor`` (a vision-language model) and the chat
    template, whose image entries the processor expands; the errors name the knob to change.
    """

    if not has_images(rows):
        texts, ids = render_rows(rows, template, tokenizer, system_prompt)
        return texts, ids, None
    _check_image_rendering(template, processor)
    return render_multimodal_rows(rows, processor, system_prompt)


def _check_image_rendering(template: str, processor) -> None:
    if processor is None:
        raise ValueError(
            "rows carry images but the model has no image processor: model.name_or_path must "
            "be a vision-language model (e.g. Qwen2-VL) for this data"
        )
    if template != "chat":
        raise ValueError(
            f"data.template={template!r}: rows with images need data.template=chat (the "
            "processor's chat template places the image entries)"
        )


def prompt_token_counts(
    rows: list[dict],
    template: str,
    tokenizer,
    system_prompt: str | None = None,
    processor=None,
) -> list[int]:
    """Each row's prompt length in tokens exactly as ``render_inputs`` lays it out, without the
    pixel work (the pre-run check reads every row: about 18 ms per scene through the processor
    here): an image's one placeholder becomes as many tokens as the image processor makes
    merged patches of an image of its size (``get_number_of_image_patches``, Qwen2-VL's)."""
    if not has_images(rows):
        return [len(ids) for ids in render_inputs(rows, template, tokenizer, system_prompt)[1]]
    _check_image_rendering(template, processor)
    ip = processor.image_processor
    if not hasattr(ip, "get_number_of_image_patches"):  # another family: its processor counts
        return [len(ids) for ids in render_multimodal_rows(rows, processor, system_prompt)[1]]
    merge = getattr(ip, "merge_size", 1) ** 2
    counts = []
    for i, row in enumerate(rows):
        if "prompt" not in row:
            raise ValueError(f"row {i}: no 'prompt' field")
        images = row_images(row, i, convert=False)
        system = row.get("system_prompt") or system_prompt
        text = render_multimodal_prompt(processor, row["prompt"], len(images), system)
        n = len(tokenizer(text, add_special_tokens=False).input_ids)
        n += sum(ip.get_number_of_image_patches(im.height, im.width) // merge - 1 for im in images)
        counts.append(n)
    return counts


def collate_vision(vision: list[PromptVision]) -> dict[str, torch.Tensor]:
    """Concatenate per-row vision inputs in row order (rows without images contribute nothing)."""
    out: dict[str, torch.Tensor] = {}
    for key in VISION_KEYS:
        parts = [v.inputs[key] for v in vision if key in v.inputs]
        if parts:
            out[key] = torch.cat(parts)
    return out


def check_image_tokens(
    is_image: torch.Tensor,
    completion_tokens: torch.Tensor,
    image_token_id: int,
    vision: dict[str, torch.Tensor],
) -> None:
    """Refuse a forward batch whose image tokens do not match the images' grids: ``is_image``
    ``[B, L]`` marks the image tokens of prompts and replies, ``completion_tokens`` are the
    replies' real tokens (none may be an image placeholder)."""
    grid = vision.get("image_grid_thw")
    if grid is None:
        raise ValueError("vision inputs without 'image_grid_thw'")
    if bool((completion_tokens == image_token_id).any()):
        raise ValueError(
            f"a reply holds the image token {image_token_id}: the model would read it as an "
            "image placeholder (engines must not sample vision tokens: vision_token_ids)"
        )
    merge = 4  # Qwen2-VL merges 2x2 patches into one token
    want = int(grid.prod(-1).sum()) // merge
    have = int(is_image.sum())
    if have != want:
        per_row = is_image.sum(-1).tolist()
        raise ValueError(
            f"image tokens per row {per_row} (total {have}) but 'image_grid_thw' asks for {want}: "
            f"prompts and images of {len(per_row)} rows are misaligned"
        )
