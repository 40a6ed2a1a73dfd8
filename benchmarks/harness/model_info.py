"""Parameter counts a worker reports for the FLOP estimate (imported in both environments)."""

from __future__ import annotations


def param_counts(model) -> dict:
    """``total``, ``embed`` (input embedding), ``head_params`` (LM head), ``nonembed_params`` and
    ``kv_bytes_per_token``.

    With tied embeddings the head is the embedding matrix, counted once in ``total``; the body
    (``nonembed_params``) is everything except the embedding and an untied head.
    """
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    tied = head.data_ptr() == emb.data_ptr()
    body = total - emb.numel() - (0 if tied else head.numel())
    return {
        "total_params": total,
        "embed_params": emb.numel(),
        "head_params": head.numel(),
        "nonembed_params": body,
        "tied_embeddings": tied,
        "kv_bytes_per_token": kv_bytes_per_token(model.config),
    }


def checkpointing(model) -> bool:
    """Whether ``model`` recomputes its forward in the backward pass (gradient, a.k.a.
    activation, checkpointing), read from the model itself: what the side really ran with."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):  # transformers 5, 4
        value = getattr(model, name, None)
        if value is not None:
            return bool(value)
    return False


def kv_bytes_per_token(config) -> int:
    """bf16 bytes of K and V over all layers for one token (the KV cache a decoding step reads).

    Example: 30 layers, 3 KV heads of dim 64: 2 x 30 x 3 x 64 x 2 = 23040 bytes.
    """
    layers = config.num_hidden_layers
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * layers * heads * head_dim * 2
