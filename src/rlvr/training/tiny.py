"""Tiny random models over a small real tokenizer, for tests and quick demos. Nothing is downloaded."""

from __future__ import annotations

import string
from pathlib import Path

import torch

_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>\n'}}{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\n'}}{% endif %}"
)


def build_char_tokenizer():
    """A character-level fast tokenizer (printable ASCII + chat specials), built in memory.

    It is a real ``PreTrainedTokenizerFast`` with a chat template, so every code path that works
    with it works with a hub tokenizer too, but a model over it has a ~110-token vocabulary.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>"]
    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
    )
    fast.chat_template = _CHAT_TEMPLATE
    fast.padding_side = "left"
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
) -> torch.nn.Module:
    """A randomly initialised causal LM (Llama or Qwen2 shape) over ``tokenizer``'s vocabulary."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    classes = {"llama": LlamaConfig, "qwen2": Qwen2Config}
    if arch not in classes:
        raise ValueError(f"unknown tiny arch {arch!r}; known: {sorted(classes)}")
    config = classes[arch](
        vocab_size=len(tokenizer),
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


def save_tiny_vlm(out_dir: Path, **kwargs) -> Path:
    """Write a tiny random Qwen2-VL shaped model folder with its processor (see ``tiny_vlm``)."""
    from rlvr.training.tiny_vlm import save_tiny_vlm as _save

    return _save(out_dir, **kwargs)
