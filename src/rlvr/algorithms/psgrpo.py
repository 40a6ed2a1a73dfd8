"""Per-step advantages for PS-GRPO with a process reward model (URSA, arXiv 2501.04686).

The URSA paper's appendix B.1 (Eq. 9) writes the per-step advantage as

    A_t^i = r_{s,t}^i * GroupNorm_G(rbar_s^i) + GroupNorm_G(r_o^i)

Our reading, for response i of a prompt group of G responses split into steps t = 0, 1, ...:

* ``r_{s,t}^i`` is the process reward model's score of step t of response i, used raw (a
  probability-like score, typically in [0, 1]; it is not normalised);
* ``rbar_s^i`` is the mean of response i's step scores;
* ``r_o^i`` is the outcome reward of response i (e.g. 1 correct, 0 wrong);
* ``GroupNorm_G(x)^i = (x^i - mean_G x) / (std_G x + eps)`` over the G responses of the prompt,
  with the same unbiased std as :func:`rlvr.algorithms.group_advantages` (``grpo``).

``A_t^i`` applies to every token of step t. The sign of the step term comes from the group
comparison of mean step scores (a response whose steps score above its group's average has
all of its steps pushed up, each in proportion to its own score; below average, pushed down).
That is what keeps the advantages signed, unlike a raw per-step reward that is always >= 0
(the "all-positive" failure mode our tests guard against). Tokens after the last step
get the outcome term only. The URSA paper itself preferred the scalar PS-GRPO reward; this
estimator exists for ablations.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from rlvr.algorithms._checks import float_dtype, require_mask, require_ndim, require_same_shape
from rlvr.algorithms.advantages import as_groups, group_advantages


@torch.no_grad()
def psgrpo_step_advantages(
    step_scores: list[list[float]],
    outcome: Tensor,
    step_token_ids: Tensor,
    mask: Tensor,
    group_size: int,
    eps: float = 1e-6,
    *,
    valid: Tensor | None = None,
) -> Tensor:
    """Token advantages ``[N, T]`` of PS-GRPO variant 2 (see the module docstring).

    Args:
        step_scores: N lists (group-major, one per response), the PRM score of each step in
            order. A response with no step gets no step term, and is left out of its group's
            statistics of mean step scores.
        outcome: ``[P, G]`` or flat ``[N]`` outcome rewards.
        step_token_ids: LongTensor ``[N, T]``, each token's step index into its row of
            ``step_scores``, or -1 for tokens after the last step (and padding).
        mask: ``[N, T]`` 0/1 response-token mask.
        group_size: G.
        eps: added to the group std in both normalisations.
        valid: optional bool ``[P, G]``/``[N]``; an invalid response (its reward failed) is left
            out of both group statistics and gets advantage 0 on every token.

    Returns:
        ``[N, T]`` advantages, 0 at masked positions.
    """
    require_ndim("step_token_ids", step_token_ids, 2)
    require_same_shape(step_token_ids=step_token_ids, mask=mask)
    if step_token_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"step_token_ids must be an integer tensor, got {step_token_ids.dtype}")
    out2d = as_groups(outcome, group_size, "outcome")
    n = out2d.numel()
    if len(step_scores) != n or step_token_ids.shape[0] != n:
        raise ValueError(
            f"row counts differ: len(step_scores)={len(step_scores)}, outcome has {n} "
            f"elements, step_token_ids has {step_token_ids.shape[0]} rows"
        )
    m = require_mask("mask", mask)
    dtype = float_dtype(outcome)
    device = step_token_ids.device

    # Ragged per-response step scores -> padded [N, S] (conversion only; the maths is batched).
    rows = [torch.as_tensor(s, dtype=dtype, device=device).reshape(-1) for s in step_scores]
    counts = torch.tensor([r.numel() for r in rows], device=device)
    width = max(int(counts.max()), 1)
    padded = torch.zeros(n, width, dtype=dtype, device=device)
    if int(counts.max()) > 0:
        padded[:, : int(counts.max())] = pad_sequence(rows, batch_first=True)
    if not bool(torch.isfinite(padded).all()):
        raise ValueError("step_scores must be finite")

    ids = step_token_ids.long()
    valid_tok = m & (ids >= 0)
    if bool((m & (ids < -1)).any()):
        raise ValueError("step_token_ids must be >= -1 on valid tokens")
    if bool((valid_tok & (ids >= counts[:, None])).any()):
        bad_row = int((valid_tok & (ids >= counts[:, None])).any(-1).nonzero()[0])
        raise ValueError(
            f"step_token_ids row {bad_row} refers to a step beyond its "
            f"{int(counts[bad_row])} step_scores"
        )

    if valid is None:
        valid_flat = torch.ones(n, dtype=torch.bool, device=device)
    else:
        valid_flat = as_groups(valid, group_size, "valid").reshape(-1)
    has_steps = counts > 0
    mean_step = padded.sum(-1) / counts.clamp(min=1).to(dtype)
    gn_step = group_advantages(
        mean_step.reshape(-1, group_size),
        group_size,
        "grpo",
        valid=(has_steps & valid_flat).reshape(-1, group_size),
        eps=eps,
    ).reshape(n)
    gn_outcome = group_advantages(
        out2d, group_size, "grpo", valid=valid_flat.reshape(-1, group_size), eps=eps
    ).reshape(n)

    tok_score = padded.gather(1, ids.clamp(0, width - 1))  # r_{s,t} for each token's step
    step_term = torch.where(valid_tok, tok_score * gn_step[:, None], torch.zeros_like(tok_score))
    adv = (step_term + gn_outcome[:, None]) * m.to(dtype)
    return adv * valid_flat[:, None].to(dtype)


@torch.no_grad()
def dense_step_advantages(
    step_scores: list[list[float]],
    outcome: Tensor,
    step_token_ids: Tensor,
    mask: Tensor,
    group_size: int,
    *,
    valid: Tensor | None = None,
) -> Tensor:
    """Token advantages ``[N, T]`` from PRM step scores used as a dense reward (the per-token
    mode beside PS-GRPO): each step's score is a reward on that step's last token, the outcome a
    reward on the reply's last token; the advantage of a token is its return-to-go (gamma 1)
    minus the group's mean total return over valid replies.

    ``step_scores``, ``step_token_ids``, ``mask`` and ``valid`` as in
    :func:`psgrpo_step_advantages`; ``mask`` must be a prefix mask (replies start at position 0).
    An invalid reply gets advantage 0 and is left out of the baseline.
    """
    require_ndim("step_token_ids", step_token_ids, 2)
    require_same_shape(step_token_ids=step_token_ids, mask=mask)
    out2d = as_groups(outcome, group_size, "outcome")
    n, width = step_token_ids.shape
    if len(step_scores) != n or out2d.numel() != n:
        raise ValueError(
            f"row counts differ: len(step_scores)={len(step_scores)}, outcome has "
            f"{out2d.numel()} elements, step_token_ids has {n} rows"
        )
    m = require_mask("mask", mask).to(float_dtype(outcome))
    rewards = torch.zeros(n, width, dtype=m.dtype, device=step_token_ids.device)
    for i, scores in enumerate(step_scores):
        for j, score in enumerate(scores):
            where = (step_token_ids[i] == j).nonzero()
            if len(where):
                rewards[i, int(where[-1])] += float(score)
        last = int(m[i].sum()) - 1
        if last >= 0:
            rewards[i, last] += out2d.reshape(-1)[i]
    returns = rewards.flip(-1).cumsum(-1).flip(-1) * m
    keep = (
        torch.ones(n, dtype=torch.bool, device=m.device)
        if valid is None
        else as_groups(valid, group_size, "valid").reshape(-1)
    )
    total = (returns[:, 0] * keep).view(-1, group_size)
    counted = keep.view(-1, group_size).sum(-1).clamp(min=1)
    baseline = (total.sum(-1) / counted).repeat_interleave(group_size)
    return (returns - baseline[:, None]) * m * keep[:, None]
