"""KL estimators between the policy and a reference, and KL coefficient controllers.

Estimators (Schulman, "Approximating KL divergence", 2020), per token, for samples drawn from
the policy, with ``x = logp - ref_logp`` clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]:

* ``k1 = x``: unbiased for KL(pi || ref), high variance, can be negative per token.
* ``k2 = 0.5 x^2``: biased, low variance, >= 0.
* ``k3 = exp(-x) + x - 1``: unbiased, >= 0; its variance grows fast with |x| (a k3 KL of ~10
  is more often misaligned log-probs than real drift).

Two ways to use KL in training, pick one:

* as a loss term: ``loss += coef * aggregate(kl_estimate(logp, ref_logp, kind), mask, mode)``
  (GRPO style; gradient flows through ``logp``);
* as a reward penalty: ``score -= coef * sum_t kl_t`` per sequence before the advantages
  (PPO style, Ziegler et al. 2019, arXiv 1909.08593; no gradient through the penalty); see
  ``rlvr.training.step.kl_penalty``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algorithms._checks import require_positive, require_same_shape

KL_KINDS: tuple[str, ...] = ("k1", "k2", "k3")
# The one bound on |log pi - log pi_old| (and |log pi - log ref|) before an exponential or a KL
# estimate: exp(20) ~ 5e8 is already far past any clip range. `algo.log_ratio_clamp` defaults to it.
LOG_RATIO_CLAMP = 20.0


def kl_estimate(logp: Tensor, ref_logp: Tensor, kind: str) -> Tensor:
    """Per-token KL estimate ``[N, T]`` (any shape) of ``logp`` against ``ref_logp``.

    Gradient flows through both inputs; detach ``ref_logp`` at the call site if the reference
    is frozen. The caller applies the mask (see :func:`rlvr.algorithms.aggregate`).
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL kind {kind!r}; known: {KL_KINDS}")
    require_same_shape(logp=logp, ref_logp=ref_logp)
    x = (logp - ref_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if kind == "k1":
        return x
    if kind == "k2":
        return 0.5 * x.pow(2)
    # k3 = exp(ref - logp) - (ref - logp) - 1; expm1 keeps precision for small x, and the clamp
    # removes a possible -1 ulp rounding residue so the estimate is never negative.
    return (torch.expm1(-x) + x).clamp(min=0)


class FixedKLController:
    """A constant KL coefficient; ``update`` does nothing (same interface as the adaptive one)."""

    def __init__(self, coef: float) -> None:
        if not coef >= 0:
            raise ValueError(f"coef must be >= 0, got {coef!r}")
        self.value = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op."""


class AdaptiveKLController:
    """Adaptive KL coefficient of Ziegler et al. (2019), as in OpenRLHF/TRL.

    After each batch: ``e = clip(current_kl / target - 1, -0.2, 0.2)`` and
    ``value *= 1 + e * n_steps / horizon``. A KL above target raises the coefficient, below
    target lowers it, by at most 20% per ``horizon`` steps.
    """

    def __init__(self, init_coef: float, target: float, horizon: float) -> None:
        if not init_coef >= 0:
            raise ValueError(f"init_coef must be >= 0, got {init_coef!r}")
        require_positive("target", target)
        require_positive("horizon", horizon)
        self.value = float(init_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move ``value`` toward keeping ``current_kl`` at ``target``; ``n_steps`` >= 0."""
        if n_steps < 0:
            raise ValueError(f"n_steps must be >= 0, got {n_steps!r}")
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
