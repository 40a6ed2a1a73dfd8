"""Log-probs and entropies straight from the last hidden states, a chunk of tokens at a time.

The full path projects every completion token onto the vocabulary at once: ``[tokens, vocab]``
logits, their float32 log-softmax kept for the backward, and the same again for the gradient
(8 replies x 2,048 tokens x Qwen's 151,936-token vocabulary is 10 GB a copy in float32). Here the
LM head's matmul, the temperature, the log-softmax, the chosen token's log-prob and the entropy
run over ``chunk`` tokens at a time inside one autograd Function. Its forward keeps only the
hidden states and one log-sum-exp (and entropy) per token; its backward recomputes each chunk's
logits and turns them into that chunk's gradient at once, so at most one chunk's
``[chunk, vocab]`` (two float32 buffers of it) is alive in the forward or the backward.

The arithmetic is the full path's, in its order: the head's matmul in the compute dtype
(autocast's bf16 or the weights'), what the model's forward does to its head's output
(``logit_transform.py``: Gemma's softcapping, Granite's and Cohere's scales), the division by
the temperature in that dtype, then float32 for the log-softmax (max, sum of exponentials, log), and the gradient handed back to the compute
dtype before the matmuls of the backward. Only the weight gradient is summed over chunks in
float32 (the full path sums over all tokens inside one matmul).

Gradient of the log-prob of token y and the entropy H with respect to the scaled logits s:
``d logp_y / ds = onehot(y) - p`` and ``dH / ds = -p * (log p + H)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from rlvr.model.logit_transform import IDENTITY, LogitTransform


def plain_head(head: torch.nn.Module | None) -> bool:
    """Whether ``head`` is a linear layer whose ``weight`` (and ``bias``) are all it computes
    with: ``nn.Linear`` and its subclasses (``lean_backward.LeanLinear``), not a peft layer
    that adds an adapter's output (``base_layer``); other heads take the full-logits path."""
    return isinstance(head, torch.nn.Linear) and not hasattr(head, "base_layer")


def head_weights(head: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The head's weight and bias as plain tensors. Under FSDP2 the head belongs to the root
    module, whose gathered weights FSDP2 keeps from the forward through the backward: then
    these are the gathered tensors already. A weight still sharded (a DTensor: a head wrapped
    on its own, or read after the root resharded) is gathered whole here with ``full_tensor``,
    whose backward reduce-scatters the gradient onto the shards: the chunks need every
    vocabulary row of the weight for their log-sum-exp."""
    w, b = head.weight, head.bias
    if isinstance(w, DTensor):
        w = w.full_tensor()
    if isinstance(b, DTensor):
        b = b.full_tensor()
    return w, b


def _scaled_logits(
    h: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    temperature: float,
    transform: LogitTransform,
) -> torch.Tensor:
    """One chunk's float32 logits over the temperature, as the full path computes them:
    ``w`` and ``b`` already in the compute dtype, the model's transform and the division in
    that dtype (float32 where the model upcasts)."""
    z = transform.apply(F.linear(h.to(w.dtype), w, b))  # fresh from the matmul: in place
    if temperature != 1.0:
        z.div_(temperature)
    return z.float()  # no copy in float32


class _HeadLogprobs(torch.autograd.Function):
    """``(logp [N], entropy [N])`` of ``labels`` under ``softmax(hidden @ weight.T + bias)/T``."""

    @staticmethod
    def forward(
        ctx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        labels: torch.Tensor,
        temperature: float,
        chunk: int,
        dtype: torch.dtype,
        entropy: bool,
        entropy_grad: bool,
        transform: LogitTransform,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = hidden.shape[0]
        w = weight.to(dtype)
        b = None if bias is None else bias.to(dtype)
        f32 = dict(dtype=torch.float32, device=hidden.device)
        logp, lse = torch.empty(n, **f32), torch.empty(n, **f32)
        ent = torch.empty(n if entropy else 0, **f32)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, n, chunk):
                e = min(n, s + chunk)
                z = _scaled_logits(hidden[s:e], w, b, temperature, transform)
                # log_softmax's own steps, in place: z - max - log(sum(exp(z - max)))
                top = z.amax(-1, keepdim=True)
                z.sub_(top)
                p = z.exp()
                total = p.sum(-1, keepdim=True)
                z.sub_(total.log())  # z is now log p
                lse[s:e] = (top + total.log()).squeeze(-1)
                logp[s:e] = z.gather(-1, labels[s:e, None]).squeeze(-1)
                if entropy:
                    ent[s:e] = -p.div_(total).mul_(z).sum(-1)
                del z, p
        ctx.save_for_backward(hidden, weight, bias, labels, lse, ent)
        ctx.cfg = (temperature, chunk, dtype, entropy and entropy_grad, transform)
        if not (entropy and entropy_grad):
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_lp: torch.Tensor, g_ent: torch.Tensor | None):
        hidden, weight, bias, labels, lse, ent = ctx.saved_tensors
        temperature, chunk, dtype, entropy_grad, transform = ctx.cfg
        # the dtype the temperature divides in: the compute dtype, float32 after a .float()
        scaled_dtype = torch.float32 if transform.upcasts else dtype
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        w = weight.to(dtype)
        b = None if bias is None else bias.to(dtype)
        grad_h = torch.empty_like(hidden) if need_h else None
        f32 = dict(dtype=torch.float32, device=weight.device)
        grad_w = torch.zeros(weight.shape, **f32) if need_w else None  # none for a frozen head
        grad_b = torch.zeros(weight.shape[0], **f32) if need_b else None
        use_ent = entropy_grad and g_ent is not None
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, hidden.shape[0], chunk):
                e = min(hidden.shape[0], s + chunk)
                z = _scaled_logits(hidden[s:e], w, b, temperature, transform)
                z.sub_(lse[s:e, None])  # log p
                p = z.exp()
                gl = g_lp[s:e, None]
                if use_ent:  # -g_ent * p * (log p + H), into z's buffer
                    z.add_(ent[s:e, None]).mul_(p).mul_(-g_ent[s:e, None])
                g = p.mul_(-gl)
                del p  # g's buffer: freed once g is cast below
                if use_ent:
                    g.add_(z)
                del z
                g.scatter_add_(-1, labels[s:e, None], gl)  # + g_lp * onehot(y)
                g = g.to(scaled_dtype)  # the full path's .float() hands its gradient back so
                if temperature != 1.0:
                    g.div_(temperature)
                if transform.steps:
                    # tanh's derivative needs its output: the head's output again (one more
                    # matmul) rather than a buffer kept beside log p and p
                    out = F.linear(hidden[s:e].to(dtype), w, b) if transform.needs_output else None
                    g = transform.grad(g, out, dtype)
                    del out
                if need_h:
                    grad_h[s:e] = (g @ w).to(hidden.dtype)
                if need_w:
                    h = hidden[s:e].to(dtype)
                    if dtype == torch.float32:
                        grad_w.addmm_(g.t(), h)
                    else:  # summed over chunks in float32, not rounded to bf16 at every chunk
                        grad_w.add_(g.t() @ h)
                if need_b:
                    grad_b.add_(g.sum(0))
                del g  # before the next chunk's logits: one chunk alive at a time
        gw = grad_w.to(weight.dtype) if need_w else None
        gb = grad_b.to(bias.dtype) if need_b else None
        return grad_h, gw, gb, None, None, None, None, None, None, None


def head_logprobs(
    hidden: torch.Tensor,
    head: torch.nn.Linear,
    labels: torch.Tensor,
    temperature: float = 1.0,
    *,
    chunk: int,
    dtype: torch.dtype | None = None,
    entropy: bool = True,
    entropy_grad: bool = False,
    transform: LogitTransform = IDENTITY,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs ``[N]`` of ``labels`` ``[N]`` and entropies ``[N]`` (None without
    ``entropy``) under ``head``'s logits of ``hidden`` ``[N, H]``, through ``transform`` (what
    the model's forward does to them, ``logit_transform.py``), over ``temperature``, float32,
    ``chunk`` tokens at a time. ``dtype``: the head's compute dtype (autocast's, recorded where
    the forward ran); None: the weight's. The log-probs carry the gradient of ``hidden`` and
    the head's weights; the entropies only with ``entropy_grad`` (an entropy bonus).
    """
    if hidden.dim() != 2 or labels.shape != hidden.shape[:1]:
        raise ValueError(
            f"head_logprobs: hidden {tuple(hidden.shape)} and labels {tuple(labels.shape)} "
            "must be [N, H] and [N] (one label per hidden state)"
        )
    if chunk < 1:
        raise ValueError(f"head_logprobs: chunk must be >= 1 token, got {chunk}")
    weight, bias = head_weights(head)
    grad = entropy and entropy_grad and torch.is_grad_enabled()
    logp, ent = _HeadLogprobs.apply(
        hidden,
        weight,
        bias,
        labels,
        temperature,
        chunk,
        dtype or weight.dtype,
        entropy,
        grad,
        transform,
    )
    return logp, (ent if entropy else None)
