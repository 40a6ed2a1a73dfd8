"""PPO with a learned critic (arXiv 1707.06347): GAE advantages (arXiv 1506.02438) over tokens.

The critic is a linear value head on the policy's last hidden state, trained with the clipped
value loss beside the policy. The scalar reward sits on each completion's last token. Advantages
are whitened over the batch's valid tokens by default (``algo.ppo.whiten_advantages``), as verl
always does and OpenRLHF does by default.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlvr.algorithms import gae_advantages, value_loss, whiten
from rlvr.distributed import sum_over_ranks
from rlvr.model.forward import SequenceBatch, policy_outputs
from rlvr.objectives.base import Needs, Objective, no_wrap, register
from rlvr.objectives.batch import MicroBatch, MinibatchCounts, RolloutBatch, pad_rows


@register("ppo")
class PPO(Objective):
    default_loss_agg = "token_mean"

    def __init__(self, cfg, tokenizer=None) -> None:
        super().__init__(cfg, tokenizer)
        self.value_head: torch.nn.Linear | None = None
        self._value_fn: torch.nn.Module | None = None  # the head, or its DDP wrapper

    def attach(
        self,
        model: torch.nn.Module,
        device: torch.device,
        wrap: Callable[[torch.nn.Module], torch.nn.Module] = no_wrap,
    ) -> list[dict]:
        hidden = model.config.get_text_config().hidden_size  # a VLM's: its language model's
        head = torch.nn.Linear(hidden, 1).to(device)
        torch.nn.init.zeros_(head.weight)
        torch.nn.init.zeros_(head.bias)
        self.value_head = head
        # several processes: the critic's gradients are averaged over ranks like the policy's
        self._value_fn = wrap(head)
        return [{"params": list(head.parameters()), "lr": self.cfg.algo.ppo.value_lr}]

    def modules(self) -> dict[str, torch.nn.Module]:
        return {} if self.value_head is None else {"value_head": self.value_head}

    def state_dict(self) -> dict | None:
        return None if self.value_head is None else self.value_head.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        if state is None or self.value_head is None:
            raise ValueError(
                "the checkpoint and this run disagree on the value head (was algo.objective changed?)"
            )
        self.value_head.load_state_dict(state)

    def needs(self) -> Needs:
        return Needs(reference=super().needs().reference, old_logp=True, values=True)

    def forward(self, model: torch.nn.Module, sb: SequenceBatch) -> dict[str, torch.Tensor]:
        """The policy's outputs and the critic's value of each completion position ``[B, Tc]``
        (from the same last hidden states the chunked log-probs read)."""
        chunk = self.cfg.algo.logprob_chunk_tokens
        policy, hidden = policy_outputs(model, sb, chunk_tokens=chunk, hidden_states=True)
        return {"policy": policy, "values": self._value_fn(hidden.float()).squeeze(-1)}

    def prepare(self, batch: RolloutBatch) -> dict[str, float]:
        comp_ids = batch.comp_ids
        mask = batch.token_mask()
        valid = batch.valid.reshape(-1)
        mask = mask * valid.float().unsqueeze(1)
        rewards = torch.zeros_like(mask)
        flat = batch.scores.reshape(-1)
        for i, c in enumerate(comp_ids):
            if c and valid[i]:  # on the last model token (an episode's may precede env tokens)
                rewards[i, int(mask[i].nonzero().max())] = flat[i]
        values = pad_rows(batch.values, mask.shape[1])
        p = self.cfg.algo.ppo
        adv, returns = gae_advantages(rewards, values, mask, p.gamma, p.lam)
        # the whole batch's statistics, over every rank's slice, as in one process
        if p.whiten_advantages and sum_over_ranks(mask.sum()) > 1:
            adv = whiten(adv, mask, total=sum_over_ranks)
        batch.advantages = [adv[i, : len(c)] for i, c in enumerate(comp_ids)]
        batch.tok["returns"] = [returns[i, : len(c)] for i, c in enumerate(comp_ids)]
        batch.tok["old_values"] = [values[i, : len(c)] for i, c in enumerate(comp_ids)]
        return {}

    def loss(self, mb: MicroBatch, counts: MinibatchCounts) -> tuple[torch.Tensor, dict]:
        loss, stats = super().loss(mb, counts)
        p = self.cfg.algo.ppo
        vloss, vstats = value_loss(
            mb.values,
            mb.tok["old_values"],
            mb.tok["returns"],
            mb.mask,
            clip=p.value_clip,
            agg_mode="token_mean",
            denominator=max(1, counts.tokens),
        )
        stats.update({k: float(v) for k, v in vstats.items()})
        stats["value_loss"] = float(vloss.detach())
        return loss + p.value_coef * vloss, stats
