"""A forward pass that runs each distinct prompt of a micro-batch once.

The samples of a group share their prompt, and in a causal model a prompt's hidden states do not
depend on what follows it: running the prompt once per sample repeats the same arithmetic. Here
the prompts' tokens but the last run once per distinct prompt into a key/value cache, the cache
rows are copied to the samples that share them (a matmul whose backward sums over the copies),
and the samples run their last prompt token and their completion against it. The logits, the
last hidden states (a critic's input) and the gradient through the cache are the full pass's up
to summation order. On the ``target`` benchmark (49-token prompts, 8 samples a prompt, replies
of ~10-48 tokens padded to their micro-batch's longest) the update's forward and backward put
about 30% fewer positions through the model. Where the model allows, the completions then run
without their padding (``training/packed_rows.py``).

Not used under gradient checkpointing (transformers then drops the cache:
``GradientCheckpointingLayer``), with FSDP2 or DDP (``can_share_prompt``), nor for vision
inputs: ``completion_outputs`` runs the full pass then.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

from rlvr.model.packed_rows import NO_LOGITS, can_pack, packed_completion_pass


def shared_prompt_rows(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(firsts, copies)`` of the rows' prompts (the first ``prompt_len`` columns, left-padded)
    as ``distinct_rows`` gives them; ``(None, None)`` when no two rows share a prompt or the
    prompts are one token long (nothing before the last token to share)."""
    if prompt_len < 2:
        return None, None
    return distinct_rows(input_ids[:, :prompt_len], attention_mask[:, :prompt_len])


def can_share_prompt(model: torch.nn.Module) -> bool:
    """False where transformers would drop the cache the shared pass builds (a layer that
    checkpoints its activations in training), and under FSDP2 or DDP, which expect one forward
    per backward (FSDP2 frees the gathered weights the first pass's backward needs). Asked of
    every module, whatever wraps the model (LoRA, FSDP, DDP)."""
    return not any(
        isinstance(m, (FSDPModule, DistributedDataParallel))
        or (m.training and getattr(m, "gradient_checkpointing", False) is True)
        for m in model.modules()
    )


def shared_prompt_outputs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    prompt_len: int,
    firsts: torch.Tensor,
    copies: torch.Tensor,
    *,
    hidden_states: bool = False,
    logits: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Logits predicting each completion token of left-padded prompts (``prompt_len`` columns)
    followed by right-padded completions (``Tc`` columns), the prompts run once per distinct row
    ``firsts``; row ``i`` repeats prompt ``copies[i]`` (``shared_prompt_rows``). The logits are
    ``[B, Tc, V]``, or where the completions run packed (``packed_rows.can_pack``) those of the
    N real completion tokens only, ``[N, V]`` row by row. With ``hidden_states``, also the last
    layer's hidden states at the completion positions ``[B, Tc, H]``, else None. Without
    ``logits``, no position goes through the LM head: ``(None, hidden states)``."""
    device = input_ids.device
    firsts, copies = firsts.to(device), copies.to(device)
    head = prompt_len - 1  # the last prompt token runs with the completion: it predicts token 0
    # one embedding lookup for both passes: one (dense, vocabulary-sized) embedding gradient
    embeds = model.get_input_embeddings()(input_ids)
    cache = DynamicCache(config=model.config)
    prompt_pass = dict(
        inputs_embeds=embeds[firsts, :head],
        attention_mask=attention_mask[firsts, :head],
        position_ids=position_ids[firsts, :head],
        past_key_values=cache,
        use_cache=True,
    )
    # the prompt's logits are never used: its pass stops before the LM head where it can
    decoder = model.get_decoder()
    if decoder is model:
        model(**prompt_pass, logits_to_keep=1)  # 1: the fewest transformers allows
    else:
        decoder(**prompt_pass)
    _copy_rows(cache, copies, len(firsts))
    tc = input_ids.shape[1] - prompt_len
    real = attention_mask[:, prompt_len:].bool()  # the inputs whose next token is a reply's
    if can_pack(model, cache) and real.any():  # only the real positions: logits [N, V]
        return packed_completion_pass(
            model,
            embeds[:, head:-1],
            attention_mask[:, :-1],
            position_ids[:, head:-1],
            real,
            cache,
            hidden_states=hidden_states,
            logits=logits,
        )
    out = model(
        inputs_embeds=embeds[:, head:-1],
        attention_mask=attention_mask[:, :-1],
        position_ids=position_ids[:, head:-1],
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=tc if logits else NO_LOGITS,
        output_hidden_states=hidden_states or not logits,
    )
    hidden = out.hidden_states[-1] if hidden_states or not logits else None
    return (out.logits if logits else None), hidden


def _copy_rows(cache: DynamicCache, copies: torch.Tensor, n_prompts: int) -> None:
    """Row ``i`` of every cache layer becomes distinct prompt ``copies[i]``'s. The copy is a
    float32 matmul by a one-hot ``[B, prompts]`` matrix, exact in the forward (for finite keys);
    its backward sums each prompt's key/value gradients over its samples in one float32 matmul
    (indexing would sum them with a slow scatter-add, and in bf16 under autocast, rounding at
    every add)."""
    pick = F.one_hot(copies, n_prompts).float()  # [B, prompts]
    with torch.autocast(copies.device.type, enabled=False):
        for layer in cache.layers:
            if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer):
                layer.batch_select_indices(copies)  # a layer with more per-row state
                continue
            for name in ("keys", "values"):
                x = getattr(layer, name)
                rows = pick @ x.float().flatten(1)
                setattr(layer, name, rows.view(len(copies), *x.shape[1:]).to(x.dtype))


def distinct_rows(
    input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(firsts, copies)``: the first row of each distinct prompt (ids and mask alike) and, for
    every row, which of those it repeats, so ``x[firsts][copies]`` is ``x``; ``(None, None)``
    when no two rows are the same. On CPU indices, whatever the rows' device."""
    rows = torch.cat([input_ids, attention_mask], dim=1).cpu()
    _, copies, counts = torch.unique(rows, dim=0, return_inverse=True, return_counts=True)
    if len(counts) == rows.shape[0]:
        return None, None
    firsts = torch.full((len(counts),), rows.shape[0], dtype=torch.long)
    firsts.scatter_reduce_(0, copies, torch.arange(rows.shape[0]), reduce="amin")
    return firsts, copies
