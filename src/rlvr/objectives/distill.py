"""On-policy distillation (Agarwal et al., arXiv 2306.13649): the student samples, a frozen teacher
scores the student's own tokens, and each token's advantage is the teacher's log-prob minus the
student's, the negative of a one-sample estimate of the per-token reverse KL
``KL(student || teacher)``. The clipped surrogate over these advantages lowers that KL on the
states the student itself visits (the student's mistakes are where the teacher's signal lands).

``algo.teacher.name_or_path``: the teacher, sharing the student's tokenizer (checked at start). It
is loaded once, in ``attach``, kept in eval mode with no gradient, never given to the optimizer
nor saved in a checkpoint. ``algo.teacher.reward_weight`` > 0 mixes in the verifiable reward: each
token's advantage adds that weight times its sequence's Dr.GRPO advantage (r - group mean).

The teacher scores at temperature 1 (its own distribution); the student's log-probs are those of
its sampling distribution (``rollout.temperature``), taken by the step's old-log-prob pass. Text
models only. Logged: ``distill_reverse_kl`` (mean over valid sequences' model tokens of student - teacher
log-prob) and ``distill_teacher_logp_mean``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlvr.algorithms import group_advantages
from rlvr.model.forward import policy_outputs
from rlvr.model.loading import load_model_and_tokenizer
from rlvr.objectives.base import Needs, Objective, no_wrap, register
from rlvr.objectives.batch import RolloutBatch


@register("distill")
class Distill(Objective):
    default_loss_agg = "token_mean"

    @classmethod
    def check(cls, cfg) -> list[str]:
        if not cfg.algo.teacher.name_or_path:
            return [
                "algo.objective=distill needs algo.teacher.name_or_path (the teacher model: hub id "
                "or local folder, with the student's tokenizer)"
            ]
        return []

    def __init__(self, cfg, tokenizer=None) -> None:
        super().__init__(cfg, tokenizer)
        self.teacher: torch.nn.Module | None = None

    def attach(
        self,
        model: torch.nn.Module,
        device: torch.device,
        wrap: Callable[[torch.nn.Module], torch.nn.Module] = no_wrap,
    ) -> list[dict]:
        """Load the teacher once, frozen; it adds no parameters to the optimizer."""
        name = self.cfg.algo.teacher.name_or_path
        dtype = torch.bfloat16 if self.cfg.model.dtype == "bfloat16" else torch.float32
        teacher, tokenizer = load_model_and_tokenizer(name, dtype=dtype, device=str(device))
        if self.tokenizer is not None and tokenizer.get_vocab() != self.tokenizer.get_vocab():
            raise ValueError(
                f"algo.teacher.name_or_path={name!r}: the teacher's tokenizer differs from the "
                "student's; distillation compares log-probs of the same token ids"
            )
        self.teacher = teacher.eval().requires_grad_(False)
        return []

    def needs(self) -> Needs:
        # the student's log-probs of its own samples, before the update
        return Needs(reference=self.cfg.algo.beta > 0, old_logp=True)

    @torch.no_grad()
    def teacher_logprobs(self, batch: RolloutBatch) -> list[torch.Tensor]:
        """The teacher's log-prob of every completion token, one ``[len_i]`` tensor per sequence."""
        if self.teacher is None:
            raise RuntimeError("distill: attach() loads the teacher before the first step")
        out: list = [None] * batch.size
        comp_ids = batch.comp_ids
        pad = self.tokenizer.pad_token_id
        for idx in self.micro_batches(list(range(batch.size)), batch):
            device = next(self.teacher.parameters()).device
            sb = batch.sequence_batch(
                idx, pad, share_prompt=self.cfg.algo.share_prompt, device=device
            )
            scored, _ = policy_outputs(
                self.teacher, sb, chunk_tokens=self.cfg.algo.logprob_chunk_tokens
            )
            lp, _ = scored.logprobs(sb, 1.0, entropy=False)
            lp = lp.float().cpu()  # beside the student's old log-probs, on the CPU
            for row, i in enumerate(idx):
                out[i] = lp[row, : len(comp_ids[i])]
        return out

    def prepare(self, batch: RolloutBatch) -> dict[str, float]:
        teacher = self.teacher_logprobs(batch)
        student = [x.float() for x in batch.old_logp]
        adv = [t - s for t, s in zip(teacher, student, strict=True)]
        w = self.cfg.algo.teacher.reward_weight
        if w > 0:
            seq = group_advantages(
                batch.scores, batch.group_size, "drgrpo", valid=batch.valid
            ).reshape(-1)
            adv = [a + w * seq[i] for i, a in enumerate(adv)]
        batch.advantages = adv
        # over the model's tokens: an episode's environment tokens were not sampled by the student
        s, t = batch.model_token_values(student), batch.model_token_values(teacher)
        if not len(s):
            return {}
        return {
            "distill_reverse_kl": float((s - t).mean()),
            "distill_teacher_logp_mean": float(t.mean()),
        }
