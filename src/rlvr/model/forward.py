"""The policy's forward pass over prompt + completion rows: padded, shared-prompt or packed; the
completion tokens' log-probs from its full logits or, chunk by chunk, from its hidden states."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.nn.parallel import DistributedDataParallel

from rlvr.data.multimodal import check_image_tokens
from rlvr.model.head_logprobs import head_logprobs, plain_head
from rlvr.model.logit_transform import IDENTITY, LogitTransform, logit_transform
from rlvr.model.logprobs import completion_logprobs
from rlvr.model.packed_rows import NO_LOGITS, PackedRows
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

    def to(self, device: torch.device | str) -> SequenceBatch:
        """The same rows with every tensor on ``device`` (the model's): the batch is laid out on
        the CPU, the forward runs where the weights are. Itself where nothing moves."""
        device = torch.device(device)
        if self.input_ids.device == device:
            return self

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)

        return SequenceBatch(
            input_ids=move(self.input_ids),
            attention_mask=move(self.attention_mask),
            position_ids=move(self.position_ids),
            completion_ids=move(self.completion_ids),
            completion_mask=move(self.completion_mask),
            vision={k: move(v) for k, v in self.vision.items()},
            # which rows repeat which prompt: indices the shared-prompt pass moves itself
            prompt_firsts=self.prompt_firsts,
            prompt_copies=self.prompt_copies,
        )

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
    model: torch.nn.Module,
    batch: SequenceBatch,
    *,
    hidden_states: bool = False,
    logits: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Logits that predict each completion token ``[B, Tc, V]`` and, with ``hidden_states``, the
    last layer's hidden states at the same positions ``[B, Tc, H]`` (a critic's input), else None.

    Only the last ``Tc + 1`` positions are projected to the vocabulary (``logits_to_keep``); the
    final position predicts past the sequence end and is dropped. Rows that share a prompt
    (``batch.prompt_firsts``) run it once, unless the model checkpoints its activations or is
    wrapped for FSDP2/DDP (``training/shared_prompt.py``); their completions then run without
    padding where the model allows (``training/packed_rows.py``) and the logits are those of the
    real completion tokens only, ``[N, V]``: read them with ``completion_logprobs``.
    Without ``logits``, no position goes through the LM head: ``(None, hidden states)``.
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
            logits=logits,
        )
    # A VLM computes its multimodal positions from the ids, the mask and the image grids.
    positions = {"position_ids": batch.position_ids} if not batch.vision else batch.vision
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        **positions,
        logits_to_keep=tc + 1 if logits else NO_LOGITS,
        use_cache=False,
        output_hidden_states=hidden_states or not logits,
    )
    keep = hidden_states or not logits
    hidden = out.hidden_states[-1][:, -(tc + 1) : -1, :] if keep else None
    return (out.logits[:, :-1, :] if logits else None), hidden


def output_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """The model's LM head (``get_output_embeddings``), under DDP's wrapper too."""
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    get = getattr(inner, "get_output_embeddings", None)
    return get() if get is not None else None


@dataclass
class PolicyOutputs:
    """What a forward pass leaves for the completion log-probs: the completion logits (the
    full path), or the last hidden states at the completion positions ``[B, Tc, H]`` with the
    LM head and what the model's forward does to the head's output (``transform``), read
    ``chunk_tokens`` tokens at a time (``head_logprobs.py``)."""

    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    head: torch.nn.Module | None = None
    chunk_tokens: int = 0
    transform: LogitTransform = IDENTITY
    # the head's compute dtype where the forward ran (autocast's bf16), None: the weight's
    dtype: torch.dtype | None = None

    def logprobs(
        self,
        batch: SequenceBatch,
        temperature: float = 1.0,
        *,
        entropy: bool = True,
        entropy_grad: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs and entropies ``[B, Tc]`` of ``batch``'s completion tokens under the
        sampling distribution, as ``completion_logprobs`` gives them (zeros at the padding
        on the chunked path, which reads only the real tokens)."""
        if self.logits is not None:
            kw = dict(entropy=entropy, entropy_grad=entropy_grad)
            return completion_logprobs(self.logits, batch, temperature, **kw)
        device = self.hidden.device  # the indices where the hidden states are
        rows = PackedRows.from_mask(batch.completion_mask.to(device).bool())
        logp, ent = head_logprobs(
            rows.pack(self.hidden),
            self.head,
            rows.pack(batch.completion_ids.to(device)),
            temperature,
            chunk=self.chunk_tokens,
            dtype=self.dtype,
            entropy=entropy,
            entropy_grad=entropy_grad,
            transform=self.transform,
        )
        return rows.unpack(logp), (rows.unpack(ent) if ent is not None else None)


def policy_outputs(
    model: torch.nn.Module,
    batch: SequenceBatch,
    *,
    chunk_tokens: int | None = 0,
    hidden_states: bool = False,
) -> tuple[PolicyOutputs, torch.Tensor | None]:
    """The forward pass of ``completion_outputs`` for log-probs: with ``chunk_tokens`` (and a
    plain linear LM head: ``head_logprobs.plain_head``, whose output the model's forward
    transforms in a way rlvr recognises: ``logit_transform.logit_transform``) no logits, only
    the last hidden states, read chunk by chunk; else (0 or None) the full logits. Also
    returns the hidden states ``[B, Tc, H]`` with ``hidden_states`` (a critic's input), else
    None."""
    head = output_head(model)
    chunked = bool(chunk_tokens) and plain_head(head)
    transform = logit_transform(model, head) if chunked else None
    if transform is None:
        logits, hidden = completion_outputs(model, batch, hidden_states=hidden_states)
        return PolicyOutputs(logits=logits), hidden
    _, hidden = completion_outputs(model, batch, logits=False)
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    out = PolicyOutputs(
        hidden=hidden, head=head, chunk_tokens=chunk_tokens, dtype=dtype, transform=transform
    )
    return out, (hidden if hidden_states else None)


def sequence_logprobs(
    model: torch.nn.Module,
    batch: SequenceBatch,
    *,
    temperature: float = 1.0,
    chunk_tokens: int | None = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs ``[B, Tc]`` (with grad) and entropies ``[B, Tc]`` of the completions.

    Logits are divided by the sampling temperature so the policy in the ratio is the one that
    sampled. ``chunk_tokens``: as ``policy_outputs`` (0: the full logits).
    """
    out, _ = policy_outputs(model, batch, chunk_tokens=chunk_tokens)
    return out.logprobs(batch, temperature if temperature > 0 else 1.0)
