"""The rollout engine protocol: what the trainer needs from anything that generates completions."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. temperature 0 means greedy (then n must be 1 for distinct outputs)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 48
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # One seed per prompt: each prompt's samples then do not depend on which other prompts share
    # the batch (or the process), so 1-process and N-process runs draw the same completions.
    prompt_seeds: tuple[int, ...] | None = None


@dataclass
class Completion:
    """One sampled completion of one prompt.

    token_ids: generated tokens, including a final EOS when the model stopped by itself.
    logprobs: the sampler's log-prob of each token (temperature-scaled distribution), same length.
    finish_reason: "stop" (EOS or stop string) or "length" (hit max_new_tokens).
    """

    prompt_index: int
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    # The trainer's policy version of the weights that sampled it (the step stamps it at generation)
    policy_version: int | None = None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


class RolloutEngine(Protocol):
    name: str
    # The trainer's policy version (updates applied) of the weights the engine samples from;
    # the run loop syncs whenever it differs from the train state's (training/step.sync_engine).
    policy_version: int

    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, vision: list | None = None
    ) -> list[list[Completion]]:
        """``params.n`` completions for each prompt: result[i][j] is prompt i's j-th sample.

        ``vision`` (image prompts of a vision-language model only; callers omit it for text):
        one ``rlvr.data.multimodal.PromptVision`` per prompt, whose image placeholders
        ``prompt_ids`` already hold expanded."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Make the engine sample from these weights from now on."""
        ...

    def close(self) -> None:
        """Release the engine's processes and memory; safe to call twice."""
        ...
