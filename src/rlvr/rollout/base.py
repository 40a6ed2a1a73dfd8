"""The rollout engine protocol: what the trainer needs from anything that generates completions."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
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
class EpisodeInfo:
    """What a multi-turn episode did (rlvr.rollout.episodes), beside its tokens."""

    turns: int = 0  # model turns
    tool_calls: int = 0
    tool_failures: int = 0
    env_reward: float | None = None  # the sum of the environment's rewards; None: it gave none
    gives_reward: bool | None = None  # the environment's gives_reward (rlvr.envs.base)
    failed: str = ""  # why the environment failed (raised, hung, flooded); "": it did not
    model_tokens: int = 0
    env_tokens: int = 0
    final_text: str = ""  # the last model turn, what the reward specs grade
    transcript: list[tuple[str, str]] = field(default_factory=list)  # ("model" | "env", text)
    # agents (rlvr.rollout.agents): sequences the endpoint started after the first (the agent
    # rewrote its history), those earlier sequences, what the agent returned beside its reward
    splits: int | None = None  # None: not an agent's episode
    earlier: list[Completion] = field(default_factory=list)
    agent_info: dict = field(default_factory=dict)


@dataclass
class Completion:
    """One sampled completion of one prompt, or one episode after it.

    token_ids: generated tokens, including a final EOS when the model stopped by itself; for an
    episode, every turn's tokens after the prompt (the model's as sampled, the environment's).
    logprobs: the sampler's log-prob of each token (temperature-scaled distribution), same length
    (0.0 at environment tokens).
    finish_reason: "stop" (EOS or stop string; an episode: the environment said done), "length"
    (hit max_new_tokens or rollout.max_episode_tokens) or "turns" (rollout.max_turns).
    loss_mask: 1 at the model's tokens, 0 at the environment's; None: every token is the model's.
    token_versions: the policy version that sampled each token, where a weight push landed during
    the generation (``rollout.partial``: the tokens after it come from the new weights, and
    ``logprobs`` are theirs); None: every token was sampled by ``policy_version``.
    """

    prompt_index: int
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    # The trainer's policy version of the weights that sampled it (the step stamps it at
    # generation); with token_versions, the oldest of them (its first token's)
    policy_version: int | None = None
    loss_mask: list[int] | None = None
    episode: EpisodeInfo | None = None
    # its own prompt where it differs from its row's (an agent's sequence: rlvr.rollout.agents)
    prompt_ids: list[int] | None = None
    token_versions: list[int] | None = None

    def versions(self) -> list[int] | None:
        """The version of each token: ``token_versions``, else ``policy_version`` repeated."""
        if self.token_versions is not None:
            return self.token_versions
        return None if self.policy_version is None else [self.policy_version] * len(self.token_ids)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @property
    def response(self) -> str:
        """The text the reward specs grade: the reply, or an episode's last model turn."""
        return self.episode.final_text if self.episode is not None else self.text

    @property
    def model_token_count(self) -> int:
        return len(self.token_ids) if self.loss_mask is None else sum(self.loss_mask)


class RolloutEngine(Protocol):
    name: str
    # The trainer's policy version (updates applied) of the weights the engine samples from;
    # the run loop syncs whenever it differs from the train state's (training/overlap.sync_engine).
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
