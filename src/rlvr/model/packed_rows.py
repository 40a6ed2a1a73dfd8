"""The completion pass of shared prompts without padding: only real tokens go through the model.

A micro-batch's replies are padded to its longest (on the ``target`` benchmark a third of the
completion positions were padding, which every linear layer, the LM head and their backward
computed for nothing). After the shared prompt pass (``training/shared_prompt.py``), the rows'
real positions are packed into one row ``[1, N]`` and go through the model that way: every
per-token layer sees N positions, not ``B x Tc``. Attention is the one layer that mixes
positions: there the packed queries, keys and values are laid back out as ``[B, heads, Tc, D]``
(``index_copy``: its backward is a gather), each row's prompt keys from the cache go in front,
and the grouped eager attention (or SDPA, ``PACKED_SDPA``: the GPU's) runs on them with the
same mask as the padded pass; its output is packed again. The arithmetic of every real position is the padded pass's.

transformers hands unknown keyword arguments of a model's forward down to its attention function,
so the layout travels as ``packed_rows=PackedRows(...)`` and ``grouped_eager_attention`` or
``packed_sdpa_attention`` unpacks.
Used only where that function is the model's attention and every cache layer is a plain
full-attention one (``can_pack``); elsewhere the padded pass runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.masking_utils import create_causal_mask

from rlvr.model.attention import GROUPED_EAGER, PACKED_ROWS, PACKED_SDPA

# ``logits_to_keep`` that sends no position through the LM head (an int 0 would keep them all):
# the forward then gives only hidden states, for log-probs read chunk by chunk
# (``head_logprobs.py``)
NO_LOGITS = torch.empty(0, dtype=torch.long)


@dataclass
class PackedRows:
    """Where each packed position sits in the padded ``[rows, width]`` layout.

    ``flat`` ``[N]``: the row-major index ``row * width + column`` of each real position, in
    increasing order (row by row, left to right). ``cache``: each row's prompt keys and values
    (already one cache row per row), read by layer index in front of the row's own keys.
    """

    flat: torch.Tensor
    rows: int
    width: int
    cache: DynamicCache | None = None

    @classmethod
    def from_mask(cls, real: torch.Tensor, cache: DynamicCache | None = None) -> PackedRows:
        """The layout of the true entries of ``real`` ``[rows, width]``."""
        flat = real.reshape(-1).nonzero().squeeze(1)
        return cls(flat=flat, rows=real.shape[0], width=real.shape[1], cache=cache)

    @property
    def size(self) -> int:
        return int(self.flat.numel())

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """``[rows, width, ...]`` -> ``[N, ...]``: the real positions, row by row."""
        return x.reshape(self.rows * self.width, *x.shape[2:]).index_select(0, self.flat)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, ...]`` -> ``[rows, width, ...]``, zeros at the padding (a gather's backward)."""
        out = x.new_zeros(self.rows * self.width, *x.shape[1:])
        return out.index_copy(0, self.flat, x).view(self.rows, self.width, *x.shape[1:])

    def unpack_heads(self, x: torch.Tensor) -> torch.Tensor:
        """A packed attention input ``[1, heads, N, D]`` -> ``[rows, heads, width, D]``."""
        return self.unpack(x[0].transpose(0, 1)).transpose(1, 2)

    def attention_inputs(
        self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Packed query/key/value ``[1, heads, N, D]`` laid out per row, each row's prompt keys
        and values (the cache's layer ``layer_idx``) in front of its own."""
        query, key, value = (self.unpack_heads(t) for t in (query, key, value))
        if self.cache is not None:
            layer = self.cache.layers[layer_idx]
            key = torch.cat([layer.keys, key], dim=2)
            value = torch.cat([layer.values, value], dim=2)
        return query, key, value

    def pack_output(self, out: torch.Tensor) -> torch.Tensor:
        """The attention's output ``[rows, width, heads, D]`` -> ``[1, N, heads, D]``."""
        return self.pack(out).unsqueeze(0)


def can_pack(model: torch.nn.Module, cache: DynamicCache) -> bool:
    """True where the packed pass computes what the padded one does: a text model whose
    attention is ``GROUPED_EAGER`` or ``PACKED_SDPA`` (the functions that unpack) and whose
    cache layers are all full attention (a sliding window or per-row state would need more
    than a causal mask)."""
    return (
        getattr(model.config, "_attn_implementation", None) in (GROUPED_EAGER, PACKED_SDPA)
        and getattr(model.config, "vision_config", None) is None
        and all(type(layer) is DynamicLayer for layer in cache.layers)
    )


def packed_completion_pass(
    model: torch.nn.Module,
    embeds: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    real: torch.Tensor,
    cache: DynamicCache,
    *,
    hidden_states: bool = False,
    logits: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The rows' completion pass, only their real positions through the model.

    ``embeds`` ``[B, Tc, H]``, ``position_ids`` ``[B, Tc]``: the inputs from each row's last
    prompt token on; ``attention_mask`` ``[B, K + Tc]``: which cached prompt positions (K) and
    inputs are real; ``real`` ``[B, Tc]``: the inputs whose next token is a completion token;
    ``cache``: K prompt positions per row. Returns the logits of the real positions ``[N, V]``
    (row by row) and, with ``hidden_states``, the last hidden states laid out ``[B, Tc, H]``
    (zeros at padding). Without ``logits``: ``(None, hidden states)``."""
    rows = PackedRows.from_mask(real, cache)
    # the padded pass's own mask [B, 1, Tc, K + Tc], made by transformers as that pass makes it
    mask = create_causal_mask(
        config=model.config,
        inputs_embeds=embeds,
        attention_mask=attention_mask,
        past_key_values=cache,
        position_ids=position_ids,
    )
    out = model(
        inputs_embeds=rows.pack(embeds).unsqueeze(0),
        # a 4-D mask is used as given (the padded layout the attention function unpacks to)
        attention_mask=mask,
        position_ids=rows.pack(position_ids).unsqueeze(0),
        use_cache=False,
        logits_to_keep=0 if logits else NO_LOGITS,
        output_hidden_states=hidden_states or not logits,
        **{PACKED_ROWS: rows},
    )
    hidden = rows.unpack(out.hidden_states[-1][0]) if hidden_states or not logits else None
    return (out.logits[0] if logits else None), hidden
