"""The policy's forward pass over prompt + completion rows: padded, shared-prompt or packed."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlvr.data.multimodal import check_image_tokens
from rlvr.model.logprobs import completion_logprobs
from rlvr.model.shared_prompt import can_share_prompt, shared_prompt_outputs, shared_prompt_rows


@dataclass
class SequenceBatch:
    """Prompt + completion token ids laid out for one forward pass.

    Prompts are left-padded to a common length ``Lp`` and completions right-padded to ``Tc``, so
    every completion starts at the same column and ``logits_to_keep`` can skip prompt logits.
    All tensors are ``[B, Lp + Tc]`` except ``completion_ids`` and ``completion_mask`` (``[B, Tc]``).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    # Vision inputs of the prompts' images (pixel_values, image_grid_thw, mm_token_type_ids) in
    # row order; empty for text. With them, the model derives its own (M-RoPE) positions.
    vision: dict[str, torch.Tensor] = field(default_factory=dict)
    # Rows that share a prompt (a group's samples): the first row of each distinct prompt and,
    # per row, which of those it repeats (training/shared_prompt.py); None: every row runs whole.
    prompt_firsts: torch.Tensor | None = None
    prompt_copies: torch.Tensor | None = None

    @property
    def completion_len(self) -> int:
        return self.completion_ids.shape[1]

    @property
    def prompt_len(self) -> int:
        return self.input_ids.shape[1] - self.completion_len


def build_sequence_batch(
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    pad_id: int,
    *,
    vision: dict[str, torch.Tensor] | None = None,
    image_token_id: int | None = None,
    share_prompt: bool = False,
) -> SequenceBatch:
    """Lay out prompts (left-padded) and completions (right-padded) for a training forward pass.

    ``vision`` (rows' images concatenated in row order, see ``data.multimodal.collate_vision``)
    needs ``image_token_id``: each row's image tokens must match its share of ``image_grid_thw``.
    ``share_prompt``: note which rows repeat a prompt, so the forward pass runs it once
    (text only; ``completion_outputs``).
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    lp = max(len(p) for p in prompt_ids)
    tc = max(1, max(len(c) for c in completion_ids))
    b = len(prompt_ids)
    ids = torch.full((b, lp + tc), pad_id, dtype=torch.long)
    mask = torch.zeros((b, lp + tc), dtype=torch.long)
    comp = torch.full((b, tc), pad_id, dtype=torch.long)
    cmask = torch.zeros((b, tc), dtype=torch.float32)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
        ids[i, lp - len(p) : lp] = torch.tensor(p, dtype=torch.long)
        mask[i, lp - len(p) : lp] = 1
        if c:
            ids[i, lp : lp + len(c)] = torch.tensor(c, dtype=torch.long)
            mask[i, lp : lp + len(c)] = 1
            comp[i, : len(c)] = torch.tensor(c, dtype=torch.long)
            cmask[i, : len(c)] = 1.0
    # Position ids follow the attention mask, exactly as generate() computes them for left padding.
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    if not vision:
        firsts, copies = shared_prompt_rows(ids, mask, lp) if share_prompt else (None, None)
        return SequenceBatch(
            ids, mask, pos, comp, cmask, prompt_firsts=firsts, prompt_copies=copies
        )
    if image_token_id is None:
        raise ValueError("build_sequence_batch: vision inputs need image_token_id")
    is_image = ids == image_token_id
    check_image_tokens(is_image, comp[cmask.bool()], image_token_id, vision)
    extra = dict(vision, mm_token_type_ids=is_image.long())
    return SequenceBatch(ids, mask, pos, comp, cmask, extra)


def completion_outputs(
    model: torch.nn.Module, batch: SequenceBatch, *, hidden_states: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits that predict each completion token ``[B, Tc, V]`` and, with ``hidden_states``, the
    last layer's hidden states at the same positions ``[B, Tc, H]`` (a critic's input), else None.

    Only the last ``Tc + 1`` positions are projected to the vocabulary (``logits_to_keep``); the
    final position predicts past the sequence end and is dropped. Rows that share a prompt
    (``batch.prompt_firsts``) run it once, unless the model checkpoints its activations or is
    wrapped for FSDP2/DDP (``training/shared_prompt.py``); their completions then run without
    padding where the model allows (``training/packed_rows.py``) and the logits are those of the
    real completion tokens only, ``[N, V]``: read them with ``completion_logprobs``.
    """
    tc = batch.completion_len
    if batch.prompt_firsts is not None and can_share_prompt(model):
        return shared_prompt_outputs(
            model,
            batch.input_ids,
            batch.attention_mask,
            batch.position_ids,
            batch.prompt_len,
            batch.prompt_firsts,
            batch.prompt_copies,
            hidden_states=hidden_states,
        )
    # A VLM computes its multimodal positions from the ids, the mask and the image grids.
    positions = {"position_ids": batch.position_ids} if not batch.vision else batch.vision
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        **positions,
        logits_to_keep=tc + 1,
        use_cache=False,
        output_hidden_states=hidden_states,
    )
    hidden = out.hidden_states[-1][:, -(tc + 1) : -1, :] if hidden_states else None
    return out.logits[:, :-1, :], hidden


def completion_logits(model: torch.nn.Module, batch: SequenceBatch) -> torch.Tensor:
    """``completion_outputs`` without hidden states: the logits ``[B, Tc, V]`` or packed ``[N, V]``."""
    return completion_outputs(model, batch)[0]


def sequence_logprobs(
    model: torch.nn.Module, batch: SequenceBatch, *, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs ``[B, Tc]`` (with grad) and entropies ``[B, Tc]`` of the completions.

    Logits are divided by the sampling temperature so the policy in the ratio is the one that sampled.
    """
    return completion_logprobs(
        completion_logits(model, batch), batch, temperature if temperature > 0 else 1.0
    )
