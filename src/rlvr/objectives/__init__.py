"""Objectives: each one unit on the `Objective` protocol, selected by ``algo.objective``.

objective = build_objective(cfg, tokenizer)   # OBJECTIVES[cfg.algo.objective](cfg, ...)
"""

from rlvr.objectives import (  # noqa: F401  (each registers itself)
    cispo,
    distill,
    group,
    gspo,
    gspo_token,
    maxent,
    ppo,
    prm_dense,
    psgrpo,
)
from rlvr.objectives.base import OBJECTIVES, Needs, Objective, build_objective, register

__all__ = ["OBJECTIVES", "Needs", "Objective", "build_objective", "register"]
