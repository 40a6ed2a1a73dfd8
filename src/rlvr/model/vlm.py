"""Vision-language policies: tell a VLM folder from a text model and load it with its processor.

A model whose config has a ``vision_config`` (Qwen2-VL, Qwen2.5-VL shaped) is loaded with
``AutoModelForImageTextToText`` and its processor (``AutoProcessor``; the image-only Qwen2-VL
processor where torchvision, which the video processor needs, is missing). Its tokenizer is the
processor's own object, so the left padding ``prepare_tokenizer`` sets holds for both.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlvr.model.loading import (
    ModelLoadError,
    load_model_and_tokenizer,
    prepare_tokenizer,
    read_model_config,
    resolve_model_path,
)


def is_vlm_config(config) -> bool:
    """True for a vision-language model's config (it carries a vision tower's config)."""
    return getattr(config, "vision_config", None) is not None


def is_vlm(name_or_path: str) -> bool:
    """Whether ``model.name_or_path`` names a vision-language model (False when its config
    cannot be read here: the text loader then reports why)."""
    try:
        return is_vlm_config(read_model_config(name_or_path))
    except (OSError, ValueError, ModelLoadError):
        return False


def image_only_processor_class():
    """``Qwen2VLProcessor`` without its video processor.

    Qwen2-VL's video processor needs torchvision; image prompts do not, so this subclass takes
    only the image processor and the tokenizer (the text/image path is Qwen2VLProcessor's own).
    """
    from transformers import Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            self.image_token = getattr(tokenizer, "image_token", "<|image_pad|>")
            self.video_token = getattr(tokenizer, "video_token", "<|video_pad|>")
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    return ImageOnlyQwen2VLProcessor


def load_processor(path: str | Path):
    """``AutoProcessor.from_pretrained(path)``; for a Qwen2-VL folder without torchvision installed
    (the video processor needs it), the image-only Qwen2-VL processor over the same files."""
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(path)
    except (ImportError, AttributeError, TypeError, ValueError):
        processor = None
    if getattr(processor, "image_processor", None) is None:  # a bare tokenizer is not a processor
        processor = image_only_processor_class().from_pretrained(path)
    return processor


def load_policy_tokenizer(path: str) -> tuple[object, object | None]:
    """(tokenizer, processor) of the model folder ``path`` as `load_policy_model` prepares them,
    without its weights: a VLM's processor and its tokenizer, else the tokenizer and None."""
    if is_vlm(path):
        processor = load_processor(path)
        return prepare_tokenizer(processor.tokenizer), processor
    from transformers import AutoTokenizer

    return prepare_tokenizer(AutoTokenizer.from_pretrained(path)), None


def load_policy_model(
    name_or_path: str, *, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> tuple[torch.nn.Module, object, object | None]:
    """(model, tokenizer, processor): a VLM with its processor, else a causal LM and None."""
    if not is_vlm(name_or_path):
        model, tokenizer = load_model_and_tokenizer(name_or_path, dtype=dtype, device=device)
        return model, tokenizer, None
    from transformers import AutoModelForImageTextToText

    path = resolve_model_path(name_or_path)
    try:
        processor = load_processor(path)
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype)
    except OSError as exc:
        raise ModelLoadError(f"model.name_or_path: could not load {name_or_path!r}: {exc}") from exc
    tokenizer = prepare_tokenizer(processor.tokenizer)
    return model.to(device), tokenizer, processor
