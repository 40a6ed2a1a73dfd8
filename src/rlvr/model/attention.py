"""Eager attention without copying keys and values for grouped-query heads.

transformers' eager attention repeats each key/value head for the query heads that share it
(``repeat_kv``: a copy of the whole KV cache per layer per decoding step; SmolLM2-135M has 9
query heads over 3 key/value heads). Here the query heads of a group are stacked instead, so one
matmul against the un-repeated keys gives every head's scores: the same products, mask, float32
softmax and weighted sum as eager, with no copy. Measured on the default model, 32 replies of 48
tokens: the repeats were about a quarter of the decoding time.

Registered with transformers' ``AttentionInterface`` and ``AttentionMaskInterface`` under
``GROUPED_EAGER`` (the public way to add a kernel), so ``model.set_attn_implementation(GROUPED_EAGER)`` selects it for training and
generation alike: the sampler and the trainer keep computing the same arithmetic.

The grouped kernel is the arithmetic of the usual eager function (Llama's, and Gemma-2's with
its score softcapping). A model whose own eager function computes something else (attention
sinks: GPT-OSS, DeepSeek-V4, Granite-SWA, Flint, MiMo-V2-Flash, Inkling-2; a float32 product; a
softmax in the input dtype) runs that function instead, on the same (unpacked) inputs: which
one a module gets is decided once per class by comparing its modelling file's
``eager_attention_forward`` instruction by instruction with those two.
"""

from __future__ import annotations

import dis
import inspect
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

from rlvr.model.vlm import is_vlm_config

GROUPED_EAGER = "rlvr_grouped_eager"
# transformers' SDPA attention, which a packed pass's layout reaches too (the GPU's training
# attention: packed rows without eager's T x T scores; see packed_sdpa_attention)
PACKED_SDPA = "rlvr_packed_sdpa"
# the keyword under which a packed pass's layout reaches the attention (training/packed_rows.py)
PACKED_ROWS = "packed_rows"


def grouped_eager_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``query`` [B, H, q, D], ``key``/``value`` [B, Hkv, T, D] (query head ``h`` reads key
    head ``h // (H / Hkv)``, as ``repeat_kv`` lays them out); returns ``[B, q, H, D]`` and the
    attention weights ``[B, H, q, T]``, as transformers' eager attention does.

    With a packed pass's layout (``packed_rows``, training/packed_rows.py) the inputs are one
    packed row ``[1, heads, N, D]`` and ``attention_mask`` is the padded rows': they are laid
    out per row, attended as above, and the output is packed again ``[1, N, H, D]``.

    ``softcap`` (Gemma-2's ``attn_logit_softcapping``): the scaled scores become
    ``softcap * tanh(scores / softcap)`` before the mask, as transformers' Gemma-2 eager does.
    A module whose own eager function computes more (``own_eager``) runs that function, with
    every keyword transformers passed."""
    rows = kwargs.pop(PACKED_ROWS, None)
    if rows is not None:
        query, key, value = rows.attention_inputs(module.layer_idx, query, key, value)
        out, _ = grouped_eager_attention(
            module, query, key, value, attention_mask, scaling, dropout, softcap, **kwargs
        )
        return rows.pack_output(out), None
    own = own_eager(module)
    if own is not None:
        extra = {} if softcap is None else {"softcap": softcap}
        return own(
            module,
            query,
            key,
            value,
            attention_mask,
            scaling=scaling,
            dropout=dropout,
            **extra,
            **kwargs,
        )
    b, h, q, d = query.shape
    hkv, t = key.shape[1], key.shape[2]
    group = h // hkv
    # [B, Hkv, group * q, D]: each key head's query heads one after the other
    stacked = query.reshape(b, hkv, group * q, d)
    scores = torch.matmul(stacked, key.transpose(2, 3)).view(b, h, q, t) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    out = torch.matmul(weights.view(b, hkv, group * q, t), value).view(b, h, q, d)
    return out.transpose(1, 2).contiguous(), weights


def _instructions(fn: Callable) -> tuple:
    """``fn``'s bytecode as (operation, argument) pairs: equal for functions of equal source
    whatever file or line they come from."""
    return tuple((i.opname, i.argval) for i in dis.get_instructions(inspect.unwrap(fn)))


_GROUPED_ARITHMETIC: set[tuple] = set()  # the eager functions the grouped kernel computes
_OWN_EAGER: dict[type, Callable | None] = {}


def own_eager(module: torch.nn.Module) -> Callable | None:
    """The ``eager_attention_forward`` of ``module``'s modelling file where it computes
    something the grouped kernel does not, else None: the grouped kernel is its arithmetic, or
    the file has no such function to compare (the grouped kernel then runs, as it always did)."""
    cls = type(module)
    if cls not in _OWN_EAGER:
        if not _GROUPED_ARITHMETIC:
            from transformers.models.gemma2 import modeling_gemma2
            from transformers.models.llama import modeling_llama

            for ref in (modeling_llama, modeling_gemma2):
                _GROUPED_ARITHMETIC.add(_instructions(ref.eager_attention_forward))
        fn = getattr(sys.modules.get(cls.__module__), "eager_attention_forward", None)
        same = fn is None or _instructions(fn) in _GROUPED_ARITHMETIC
        _OWN_EAGER[cls] = None if same else fn
    return _OWN_EAGER[cls]


AttentionInterface.register(GROUPED_EAGER, grouped_eager_attention)
# the additive float mask eager attention takes (an unknown name would get SDPA's boolean one)
AttentionMaskInterface.register(GROUPED_EAGER, eager_mask)


def packed_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa_attention_forward`` as it is, except under a packed pass's layout
    (``packed_rows``): the packed ``[1, heads, N, D]`` inputs are laid out per row with each
    row's prompt keys in front, attended by SDPA with the padded rows' boolean mask, and the
    output packed again ``[1, N, H, D]`` (as ``grouped_eager_attention`` does for eager)."""
    rows = kwargs.pop(PACKED_ROWS, None)
    if rows is not None:
        query, key, value = rows.attention_inputs(module.layer_idx, query, key, value)
    out, _ = sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
    )
    return (rows.pack_output(out) if rows is not None else out), None


AttentionInterface.register(PACKED_SDPA, packed_sdpa_attention)
AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)


# Longest reply for which 'auto' picks eager attention on the CPU (see ModelConfig.attention).
EAGER_MAX_NEW_TOKENS = 256


def choose_attention(requested: str, device_type: str, max_new_tokens: int) -> str:
    """The attention implementation to train with: ``requested`` unless it is 'auto'.

    On the CPU, SDPA's backward for short sequences is slower than eager attention's; eager's cost is a
    ``T x T`` score matrix per head kept for the backward, so 'auto' uses it for short replies only.
    """
    if requested != "auto":
        return requested
    if device_type == "cpu" and max_new_tokens <= EAGER_MAX_NEW_TOKENS:
        return "eager"
    return "sdpa"


def use_training_attention(model: torch.nn.Module, cfg, device: str) -> None:
    """The attention kernel training used (same arithmetic, so the same greedy replies).

    On a text model eager runs as ``GROUPED_EAGER`` (eager's arithmetic without copying the
    key/value heads each query head shares) and SDPA as ``PACKED_SDPA`` (SDPA itself, which also
    takes the packed update's layout); a vision-language model keeps transformers' own."""
    kind = torch.device(device).type
    chosen = choose_attention(cfg.model.attention, kind, cfg.rollout.max_new_tokens)
    text_config = getattr(model.config, "get_text_config", lambda: model.config)()
    softcaps = getattr(text_config, "attn_logit_softcapping", None) is not None
    if chosen == "sdpa" and (softcaps or not getattr(model, "_supports_sdpa", True)):
        # SDPA cannot cap attention scores (Gemma-2) nor add sinks (GPT-OSS): transformers
        # refuses it for such models
        chosen = "eager"
    if not is_vlm_config(model.config):
        chosen = {"eager": GROUPED_EAGER, "sdpa": PACKED_SDPA}.get(chosen, chosen)
    model.set_attn_implementation(chosen)
