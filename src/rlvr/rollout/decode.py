"""The hf engine's decoding loop for text prompts: sample, record the log-prob, drop finished rows.

Why not ``model.generate``: on a CPU three of its costs are ours to remove (a large share of
decoding time for short replies of a small model: docs/performance.md). It
samples with ``torch.multinomial``, which draws one exponential per vocabulary entry (32 x 49k
per step); ``sample_next`` draws one uniform per row and inverts the cumulative distribution,
the same categorical distribution. Its cache copies every layer's keys and values into a longer
tensor at every step; ``FilledLayer`` writes the new ones into buffers sized for the whole reply.
And it runs every row until the longest reply ends; here rows that hit EOS or a stop string
leave the batch with their cache rows. A group's n samples start from one prompt, so the
prompt is prefilled once and its cache rows copied, not run n times. The sampled token's
log-prob is taken at each step, so no ``[T, B, V]`` stack of float32 logits is kept for
afterwards.

Positions follow the attention mask exactly as ``generate`` and the trainer's
``build_sequence_batch`` lay them out for left padding, so the log-probs recorded here are the
ones the trainer recomputes. Image prompts keep ``generate`` (``rollout/hf.py``): a multimodal
model derives its own positions and holds per-row offsets between steps, so rows cannot leave."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers.cache_utils import Cache, DynamicLayer
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from rlvr.model.shared_prompt import distinct_rows
from rlvr.rollout.base import SamplingParams


def truncate_scores(scores: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k then top-p (nucleus) truncation of temperature-scaled scores ``[B, V]``, with
    transformers' own warpers in the order ``generate`` applies them (0 / 1.0: off)."""
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores


def sample_next(probs: torch.Tensor, uniforms: torch.Tensor, block: int = 256) -> torch.Tensor:
    """One token per row of ``probs`` [B, V] (non-negative, zero = never): the first token whose
    cumulative probability exceeds ``uniforms`` [B] (in [0, 1)) times the row's total.

    Inverse-CDF sampling needs one uniform per row where ``torch.multinomial`` draws one
    exponential per vocabulary entry. The cumulative sum is taken in two levels: float32 sums
    of blocks of ``block`` tokens, then float64 cumulative sums over the blocks and inside the
    one block the uniform falls in. A 49k-token row's rounding stays far below any probability
    worth sampling, at the cost of ``V / block + block`` float64 numbers per row."""
    b, v = probs.shape
    nb = -(-v // block)
    padded = (F.pad(probs, (0, nb * block - v)) if v % block else probs).reshape(b, nb, block)
    block_cdf = padded.sum(-1).double().cumsum(-1)  # [B, nb]
    u = uniforms.double() * block_cdf[:, -1]
    # right=True: the first index whose cdf is above u, so a zero-probability token (a flat
    # step of the cdf) or an all-zero block can never be the one picked
    k = torch.searchsorted(block_cdf, u.unsqueeze(-1), right=True).squeeze(-1).clamp_(max=nb - 1)
    below = torch.where(
        k > 0, block_cdf.gather(1, (k - 1).clamp(min=0).unsqueeze(1)).squeeze(1), 0.0
    )
    inner = padded[torch.arange(b, device=probs.device), k].double().cumsum(-1)  # [B, block]
    j = torch.searchsorted(inner, (u - below).unsqueeze(-1), right=True).squeeze(-1)
    # rounding can leave u - below a hair above the block's own total: take its last nonzero token
    last_nonzero = (inner < inner[:, -1:]).sum(-1)  # the first index reaching the total
    j = torch.minimum(j, last_nonzero)
    return (k * block + j).clamp_(max=v - 1)


class FilledLayer(DynamicLayer):
    """transformers' growing cache layer, but written into buffers sized for the whole reply:
    a decoding step writes its one new key and value instead of copying the layer's whole cache
    into a longer tensor (``torch.cat``, what ``DynamicLayer`` does every step). ``keys`` and
    ``values`` are the filled part, so everything that reads them works unchanged."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.filled = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        b, _, _, d = key_states.shape
        self.key_buf = key_states.new_empty(b, key_states.shape[1], self.capacity, d)
        self.value_buf = value_states.new_empty(
            b, value_states.shape[1], self.capacity, value_states.shape[-1]
        )

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, t = self.filled, key_states.shape[-2]
        self.key_buf[:, :, n : n + t] = key_states
        self.value_buf[:, :, n : n + t] = value_states
        self.filled = n + t
        self._expose()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self.key_buf, self.value_buf = self.key_buf[indices], self.value_buf[indices]
            self._expose()

    def _expose(self) -> None:
        self.keys = self.key_buf[:, :, : self.filled]
        self.values = self.value_buf[:, :, : self.filled]


def filled_cache(model: torch.nn.Module, capacity: int) -> Cache:
    """A cache of ``FilledLayer``s, one per decoder layer of ``model``."""
    layers = model.config.get_text_config(decoder=True).num_hidden_layers
    return Cache(layers=[FilledLayer(capacity) for _ in range(layers)])


@dataclass
class Reply:
    """One row's reply as it grows."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "length"


StopCheck = Callable[[list[int]], bool]


def decode(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    params: SamplingParams,
    *,
    eos_token_id: int | None,
    pad_token_id: int,
    ends_with_stop: StopCheck | None = None,
    suppress: list[int] | None = None,
    synced: bool = False,
    share_prefill: bool = True,
) -> list[Reply]:
    """Sample a reply for every row of left-padded ``input_ids`` [B, L].

    A reply ends at EOS (kept), when ``ends_with_stop(tokens)`` says its text ends with a stop
    string (kept), or at ``params.max_new_tokens``. ``suppress``: token ids never sampled (their
    log-probs are still the model's own). ``synced`` (FSDP): every process must run the same
    number of forward passes, so rows never leave and the loop runs until all processes' rows
    are done, as transformers' ``synced_gpus``. ``share_prefill``: identical prompt rows (a
    group's samples) are prefilled once and their cache rows copied; False runs every row (the
    same numbers up to the rounding of a matmul over fewer rows)."""
    device = input_ids.device
    b = input_ids.shape[0]
    replies = [Reply() for _ in range(b)]
    greedy = params.temperature <= 0
    scale = 1.0 if greedy else params.temperature
    live = torch.arange(b)  # which reply each batch row still writes to
    done = torch.zeros(b, dtype=torch.bool)  # rows finished but not yet dropped (synced only)
    mask = attention_mask
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = filled_cache(model, input_ids.shape[1] + params.max_new_tokens)
    # the n samples of a prompt share it: run each distinct prompt once and copy its cache rows
    firsts, copies = distinct_rows(input_ids, mask) if share_prefill else (None, None)
    run = slice(None) if firsts is None else firsts.to(device)
    out = model(
        input_ids=input_ids[run],
        attention_mask=mask[run],
        position_ids=positions[run],
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    prefill_logits = out.logits[:, -1, :]
    if copies is not None:
        copies = copies.to(device)
        cache.batch_select_indices(copies)
        prefill_logits = prefill_logits[copies]
    last = positions[:, -1:]
    suppress_ids = torch.tensor(suppress, device=device) if suppress else None
    truncated = bool(params.top_k) or params.top_p < 1.0
    for step in range(params.max_new_tokens):
        logits = (prefill_logits if step == 0 else out.logits[:, -1, :]).float()
        if scale != 1.0:
            logits = logits / scale
        # the untruncated, temperature-scaled distribution: what the trainer scores (log_softmax
        # is about twice as fast as logsumexp over a 49k vocabulary on the CPU)
        logp_all = logits.log_softmax(-1)
        scores = logits
        if suppress_ids is not None:
            scores = scores.index_fill(1, suppress_ids, float("-inf"))
        if greedy:
            tokens = scores.argmax(-1)
        else:
            if suppress_ids is not None or truncated:
                probs = truncate_scores(scores, params.top_k, params.top_p).softmax(-1)
            else:
                probs = logp_all.exp()
            # one uniform per original row every step, live or not: a row's draws do not depend
            # on when the others left (synced processes, which keep every row, draw the same)
            tokens = sample_next(probs, torch.rand(b)[live].to(device))
        logps = logp_all.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
        finished = []
        for row, (tok, lp) in enumerate(zip(tokens.tolist(), logps, strict=True)):
            if done[row]:
                continue
            reply = replies[int(live[row])]
            reply.token_ids.append(tok)
            reply.logprobs.append(lp)
            if tok == eos_token_id or (
                ends_with_stop is not None and ends_with_stop(reply.token_ids)
            ):
                reply.finish_reason = "stop"
                finished.append(row)
        done[finished] = True
        if _all_done(bool(done.all()), synced, device) or step == params.max_new_tokens - 1:
            break
        if not synced and finished:
            keep = (~done).nonzero().squeeze(1)
            on_device = keep.to(device)
            cache.batch_select_indices(on_device)
            live, done = live[keep], done[keep]
            mask, last, tokens = mask[on_device], last[on_device], tokens[on_device]
        # a finished row (synced only) feeds pad, as generate does; its output is ignored
        tokens = tokens.masked_fill(done.to(device), pad_token_id)
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        last = last + 1
        out = model(
            input_ids=tokens.unsqueeze(1),
            attention_mask=mask,
            position_ids=last,
            past_key_values=cache,
            use_cache=True,
        )
    return replies


def _all_done(local: bool, synced: bool, device: torch.device) -> bool:
    """Whether decoding can stop: this process's rows are done and, when synced, every
    process's are (they must keep running forward passes together until then)."""
    if not synced:
        return local
    flag = torch.tensor([0.0 if local else 1.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() == 0.0
