"""Log-probs and entropies of completion tokens from logits, shape-checked."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from rlvr.model.packed_rows import PackedRows


class CompletionRows(Protocol):
    """The completion tokens ``[B, Tc]`` and their mask (1: a real token): what the log-probs
    read of a ``forward.SequenceBatch``, named here so this module need not import forward.py
    (which imports it)."""

    completion_ids: torch.Tensor
    completion_mask: torch.Tensor


def scaled_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Logits of the sampling distribution (no copy of the [B, T, V] tensor at temperature 1)."""
    return logits if temperature == 1.0 else logits / temperature


def logprobs_and_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk: int = 4,
    entropy: bool = True,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs and entropies, computed a few rows at a time.

    logits ``[B, T, V]`` (any float dtype), labels ``[B, T]`` (aligned: ``logits[:, t]``
    predicts ``labels[:, t]``). Returns two ``[B, T]`` float32 tensors (the entropies are None
    with ``entropy=False``, which skips a full softmax). The log-probs carry the logits'
    gradient; the entropies only with ``entropy_grad`` (an entropy bonus in the loss).
    Working on ``chunk`` rows at a time keeps only a small float32 copy of the logits alive.
    Mismatched shapes raise ``ValueError``: an off-by-one between logits and labels trains on
    the wrong tokens silently.
    """
    if logits.dim() != 3 or labels.dim() != 2 or logits.shape[:2] != labels.shape:
        raise ValueError(
            f"log-prob shape mismatch: logits {tuple(logits.shape)} vs labels {tuple(labels.shape)}; "
            "logits[:, t] must predict labels[:, t] (did a shift by one get lost?)"
        )
    logps, ents = [], []
    for start in range(0, logits.shape[0], chunk):
        # log_softmax rather than x - logsumexp(x): one fused pass over the vocabulary forward
        # and backward instead of two (about half the time on the CPU)
        logp_all = F.log_softmax(logits[start : start + chunk].float(), dim=-1)
        idx = labels[start : start + chunk].unsqueeze(-1)
        logps.append(torch.gather(logp_all, -1, idx).squeeze(-1))
        if entropy:
            if entropy_grad and torch.is_grad_enabled():
                ents.append(-(logp_all.exp() * logp_all).sum(-1))
            else:  # one chunk-sized temporary, not two (p, then p * log p)
                with torch.no_grad():
                    ents.append(-logp_all.exp().mul_(logp_all).sum(-1))
    return torch.cat(logps), (torch.cat(ents) if entropy else None)


# Packed positions per log-softmax chunk: logprobs_and_entropy's 4 rows of <= 48 tokens.
PACKED_CHUNK = 192


def completion_logprobs(
    logits: torch.Tensor,
    batch: CompletionRows,
    temperature: float = 1.0,
    *,
    entropy: bool = True,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs and entropies ``[B, Tc]`` of ``batch``'s completion tokens under the sampling
    distribution (logits over ``temperature``), from the logits ``completion_outputs`` gives:
    ``[B, Tc, V]``, or packed ``[N, V]`` (the real tokens only, row by row), which leaves zeros
    at the padding. ``entropy``/``entropy_grad`` as ``logprobs_and_entropy``."""
    logits = scaled_logits(logits, temperature)
    kw = dict(entropy=entropy, entropy_grad=entropy_grad)
    if logits.dim() == 3:
        return logprobs_and_entropy(logits, batch.completion_ids, **kw)
    rows = PackedRows.from_mask(batch.completion_mask.bool())
    if logits.dim() != 2 or logits.shape[0] != rows.size:
        raise ValueError(
            f"packed logits {tuple(logits.shape)} for {rows.size} completion tokens: "
            "a packed pass gives one row of logits per real completion token"
        )
    labels = rows.pack(batch.completion_ids)
    # one position per row: the chunks of logprobs_and_entropy are PACKED_CHUNK positions
    logp, ent = logprobs_and_entropy(
        logits.unsqueeze(1), labels.unsqueeze(1), chunk=PACKED_CHUNK, **kw
    )
    return rows.unpack(logp[:, 0]), (rows.unpack(ent[:, 0]) if ent is not None else None)
