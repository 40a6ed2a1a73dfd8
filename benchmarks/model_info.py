"""Parameter counts a worker reports for the FLOP estimate (imported in both environments)."""

from __future__ import annotations


def param_counts(model) -> dict:
    """``total``, ``embed`` (input embedding), ``head_params`` (LM head) and ``nonembed_params``.

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
    }
