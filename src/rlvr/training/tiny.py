"""Tiny random models over a small real tokenizer, for tests and quick demos. Nothing is downloaded.

Text: a Llama/Qwen2-shaped causal LM over a character-level tokenizer (``save_tiny_model``).
Vision-language: a Qwen2-VL shaped model whose configs are written by hand with tiny sizes; its
tokenizer is the char tokenizer plus the Qwen2-VL vision special tokens, and its image processor
is transformers' own Qwen2-VL image processor with a small pixel budget (a 56x56 image becomes a
4x4 patch grid, i.e. 4 image tokens after the 2x2 merge) (``save_tiny_vlm``).
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

from rlvr.model.vlm import image_only_processor_class

_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>\n'}}{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\n'}}{% endif %}"
)


def build_char_tokenizer():
    """A character-level fast tokenizer (printable ASCII + chat specials), built in memory.

    It is a real ``PreTrainedTokenizerFast`` with a chat template, so every code path that works
    with it works with a hub tokenizer too, but a model over it has a ~110-token vocabulary.
    """

    specials = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>"]
    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    return _char_level_tokenizer(vocab, eos="<|im_end|>")


def _char_level_tokenizer(vocab: dict[str, int], *, eos: str):
    """A character-level ``PreTrainedTokenizerFast`` over ``vocab`` with the chat specials, the
    chat template and left padding (what both tiny tokenizers share)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<|im_start|>",
        eos_token=eos,
    )
    fast.chat_template = _CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


FIXED_LENGTH_EOS = "<|endofreply|>"


def build_fixed_length_tokenizer(vocab_size: int):
    """The char tokenizer padded with filler tokens to ``vocab_size`` ids, then an EOS at id
    ``vocab_size``: a model with ``vocab_size`` output rows can never emit it, so every reply
    runs to ``max_new_tokens`` on any sampler (the GPU benchmark's equal work, the memory plan's
    GPU test). Fillers are letters only, so a reply's text holds no digits by chance."""

    base = build_char_tokenizer()
    vocab = dict(base.get_vocab())
    if vocab_size < len(vocab):
        raise ValueError(f"vocab_size={vocab_size}: the char tokenizer alone has {len(vocab)} ids")
    letters = string.ascii_lowercase
    i = 0
    while len(vocab) < vocab_size:
        name, n = "", i
        while True:  # base-26 letters: a, b, ..., z, ba, bb, ...
            name = letters[n % 26] + name
            n //= 26
            if n == 0:
                break
        vocab.setdefault(f"\u27e8{name}\u27e9", len(vocab))  # ⟨name⟩: no char token's spelling
        i += 1
    vocab[FIXED_LENGTH_EOS] = vocab_size
    fast = _char_level_tokenizer(vocab, eos=FIXED_LENGTH_EOS)
    return fast


def build_tiny_model(
    tokenizer,
    *,
    arch: str = "llama",
    hidden: int = 64,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 1,
    intermediate: int = 128,
    max_positions: int = 512,
    seed: int = 0,
    vocab_size: int | None = None,
) -> torch.nn.Module:
    """A randomly initialised causal LM (Llama or Qwen2 shape) over ``tokenizer``'s vocabulary
    (``vocab_size`` rows instead: fewer than a ``build_fixed_length_tokenizer``'s, so no EOS)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    classes = {"llama": LlamaConfig, "qwen2": Qwen2Config}
    if arch not in classes:
        raise ValueError(f"unknown tiny arch {arch!r}; known: {sorted(classes)}")
    config = classes[arch](
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def save_tiny_model(out_dir: Path, **kwargs) -> Path:
    """Write a tiny model + tokenizer folder that ``rlvr train model.name_or_path=...`` loads."""
    out_dir = Path(out_dir)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, **kwargs)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


# ----------------------------------------------------------------------------- vision-language
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")

# Qwen2-VL's chat template, reduced: string content, or a list of {"type": "image"} and
# {"type": "text", "text": ...} entries; each image becomes <|vision_start|><|image_pad|><|vision_end|>
# (the processor expands <|image_pad|> to one token per merged patch).
VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' or 'image' in item %}{{'<|vision_start|><|image_pad|><|vision_end|>'}}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{'<|im_end|>\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{'<|im_start|>assistant\n'}}{% endif %}"
)

TINY_PIXELS = 56 * 56  # min = max: every image is resized to about 56x56 pixels


def build_vlm_tokenizer():
    """The char tokenizer plus the Qwen2-VL vision special tokens and the multimodal chat template."""
    tok = build_char_tokenizer()
    tok.add_tokens(list(VISION_TOKENS), special_tokens=True)
    tok.chat_template = VLM_CHAT_TEMPLATE
    return tok


def build_vlm_processor(tokenizer=None):
    """A ``Qwen2VLProcessor`` (transformers' image processor, tiny pixel budget) over the tokenizer."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = tokenizer if tokenizer is not None else build_vlm_tokenizer()
    image_processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": TINY_PIXELS, "longest_edge": TINY_PIXELS},
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
    )
    return image_only_processor_class()(image_processor, tokenizer, chat_template=VLM_CHAT_TEMPLATE)


def build_tiny_vlm(
    tokenizer,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 1,
    intermediate: int = 128,
    vision_depth: int = 2,
    vision_dim: int = 32,
    vision_heads: int = 2,
    max_positions: int = 1024,
    init_range: float = 0.2,
    seed: int = 0,
) -> torch.nn.Module:
    """A randomly initialised ``Qwen2VLForConditionalGeneration`` over ``tokenizer``'s vocabulary."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    head_dim = hidden // heads
    half = head_dim // 2
    section = [half - 2 * (half * 3 // 8), half * 3 // 8, half * 3 // 8]  # sums to head_dim / 2
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    text_config = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": intermediate,
        "max_position_embeddings": max_positions,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": section,
        },
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "initializer_range": init_range,  # wide enough that greedy replies differ by prompt
    }
    vision_config = {
        "depth": vision_depth,
        "embed_dim": vision_dim,
        "hidden_size": hidden,
        "num_heads": vision_heads,
        "mlp_ratio": 2,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "initializer_range": init_range,
    }
    config = Qwen2VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration._from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def save_tiny_vlm(out_dir: Path, **kwargs) -> Path:
    """Write a tiny VLM folder (model, tokenizer, processor) that ``AutoProcessor`` and
    ``AutoModelForImageTextToText`` load."""
    out_dir = Path(out_dir)
    tokenizer = build_vlm_tokenizer()
    processor = build_vlm_processor(tokenizer)
    model = build_tiny_vlm(tokenizer, **kwargs)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    return out_dir
