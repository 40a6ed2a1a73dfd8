"""The environment protocol of multi-turn episodes, and a base class with its defaults.

An environment is a class; one instance plays one episode:

    env = MyEnv(**env.kwargs)
    prompt = env.reset(row)                    # a text, or [{"role", "content"}, ...] messages
    observation, reward, done = env.step(model_text)   # after every model turn

``model_text``: the model's turn decoded (special tokens skipped), for the environment to read;
the trainer keeps the sampled token ids. ``observation``: the environment's turn (None with
``done``: nothing more to say). ``reward``: a number or None; an episode's reward is the sum of
the numbers its environment gave. Optional attributes, read where present:

- ``stop``: stop strings that end a model turn (a tool call's closing tag), beside rollout.stop;
- ``observation_role``: the chat role of the environment's turns ("user" by default; "tool"
  where the model's chat template renders tool messages);
- ``gives_reward``: True when the environment's rewards alone score the episode (a missing
  reward counts 0), False when the reward specs grade the final model turn; unset: the
  environment's rewards when it gave any, else the reward specs;
- ``tool_calls``, ``tool_failures``: counters the metrics tool_calls_mean and tool_failure_rate
  read at the episode's end;
- ``close()``: called when the episode ends, whatever happened.
"""

from __future__ import annotations

import math
import re
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Environment(Protocol):
    def reset(self, row: dict) -> str | list[dict]: ...

    def step(self, model_text: str) -> tuple[str | None, float | None, bool]: ...


class Env:
    """Defaults of the optional attributes; subclass it or not (only reset/step are needed)."""

    stop: tuple[str, ...] = ()
    observation_role: str = "user"
    gives_reward: bool | None = None

    def __init__(self) -> None:
        self.tool_calls = 0
        self.tool_failures = 0

    def reset(self, row: dict) -> str | list[dict]:
        return row["prompt"]

    def step(self, model_text: str) -> tuple[str | None, float | None, bool]:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the episode held."""


class EnvError(RuntimeError):
    """An environment broke its protocol (a bad return value): its episode fails."""


def check_step(result: Any) -> tuple[str | None, float | None, bool]:
    """``step``'s return value as (observation, reward, done), or EnvError naming what is wrong."""
    if not isinstance(result, tuple) or len(result) != 3:
        raise EnvError(
            f"step() must return (observation, reward, done), got {type(result).__name__}"
        )
    obs, reward, done = result
    if obs is not None and not isinstance(obs, str):
        raise EnvError(f"step(): observation must be str or None, got {type(obs).__name__}")
    if reward is not None:
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise EnvError(f"step(): reward must be a number or None, got {reward!r}")
        if not math.isfinite(float(reward)):
            raise EnvError(f"step(): reward must be finite, got {reward!r}")
        reward = float(reward)
    if not isinstance(done, bool):
        raise EnvError(f"step(): done must be a bool, got {type(done).__name__}")
    if obs is None and not done:
        raise EnvError("step(): observation None with done=False (nothing for the next turn)")
    return obs, reward, done


class ToolEnv(Env):
    """A tool the model calls as ``<tag>ARGUMENT</tag>``; the answer comes back as
    ``<result_tag>TEXT</result_tag>``, and a turn without a call ends the episode (the reward
    specs grade it). Subclasses set the tags and ``instructions_text`` and implement ``call``."""

    tag = ""
    result_tag = "result"
    instructions_text = ""
    gives_reward = False

    def __init__(self, instructions: bool = True) -> None:
        super().__init__()
        self.instructions = instructions
        self.stop = (f"</{self.tag}>",)
        self._pattern = re.compile(rf"<{self.tag}>(.*?)</{self.tag}>", re.DOTALL)

    def reset(self, row: dict) -> str:
        prompt = row["prompt"]
        return f"{prompt}\n\n{self.instructions_text}" if self.instructions else prompt

    def step(self, model_text: str) -> tuple[str | None, float | None, bool]:
        calls = self._pattern.findall(model_text)
        if not calls:
            return None, None, True
        self.tool_calls += 1
        text, ok = self.call(calls[-1])
        if not ok:
            self.tool_failures += 1
        return f"<{self.result_tag}>{text}</{self.result_tag}>", None, False

    def call(self, argument: str) -> tuple[str, bool]:
        """The tool's answer to one call, and whether the call succeeded."""
        raise NotImplementedError
