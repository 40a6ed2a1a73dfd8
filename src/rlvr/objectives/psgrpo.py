"""PS-GRPO "variant 2" (URSA, arXiv 2501.04686): per-token advantages from process-reward-model
step scores plus the group-normalised outcome (`rlvr.algorithms.psgrpo_step_advantages`)."""

from __future__ import annotations

from rlvr.objectives.base import Objective, register


@register("psgrpo_steps")
class PSGRPOSteps(Objective):
    @classmethod
    def check(cls, cfg) -> list[str]:
        if not cfg.algo.psgrpo.prm:
            return [
                "algo.objective=psgrpo_steps needs algo.psgrpo.prm (a PRM model folder or 'pkg.mod:fn')"
            ]
        return []
