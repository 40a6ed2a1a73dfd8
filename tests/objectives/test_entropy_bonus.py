"""The entropy bonus reaches the gradient (PPO's objective, arXiv 1707.06347 eq. 9).

A bug computed the entropies under ``no_grad``: ``algo.entropy_coef`` then changed the reported
loss and not the update.
"""

from __future__ import annotations

import math

import torch

from rlvr.config import load_config
from rlvr.model.logprobs import logprobs_and_entropy
from rlvr.objectives import build_objective
from rlvr.objectives.batch import MicroBatch, MinibatchCounts


def _loss_grad(coef: float) -> torch.Tensor:
    """d loss / d logits for one sequence of one token, vocabulary of 3, advantage 0."""
    cfg = load_config(None, [f"algo.entropy_coef={coef}", "rollout.max_new_tokens=4"])
    objective = build_objective(cfg)
    logits = torch.tensor([[[0.0, math.log(2.0), math.log(5.0)]]], requires_grad=True)
    labels = torch.tensor([[2]])
    logp, ent = logprobs_and_entropy(logits, labels, entropy_grad=coef != 0)
    mb = MicroBatch(
        indices=[0],
        logp=logp,
        old_logp=logp.detach(),
        mask=torch.ones(1, 1),
        advantages=torch.zeros(1),  # the policy term's gradient is 0: only the bonus remains
        entropy=ent,
    )
    loss, _ = objective.loss(mb, MinibatchCounts(sequences=1, tokens=1))
    loss.backward()
    return logits.grad[0, 0]


def test_entropy_coefficient_changes_the_gradient_by_the_hand_computed_amount():
    # probs p = (1, 2, 5) / 8; H = -sum p ln p; dH/dz_j = -p_j (ln p_j + H).
    p = torch.tensor([1.0, 2.0, 5.0]) / 8
    entropy = -(p * p.log()).sum()  # 0.9003 nats
    dh = -p * (p.log() + entropy)
    # Dr.GRPO aggregation (default): token sum / max_new_tokens (4), mean over 1 sequence, so
    # loss = -0.5 * H / 4 and its gradient is -0.125 * dH/dz.
    expected = -0.5 / 4 * dh
    diff = _loss_grad(0.5) - _loss_grad(0.0)
    torch.testing.assert_close(diff, expected, rtol=1e-5, atol=1e-7)
    assert diff.abs().max() > 1e-2  # far from zero: the bonus is not lost


def test_without_the_bonus_entropies_carry_no_graph():
    logits = torch.randn(2, 3, 5, requires_grad=True)
    _, ent = logprobs_and_entropy(logits, torch.zeros(2, 3, dtype=torch.long))
    assert not ent.requires_grad  # no autograd memory spent on a metric
