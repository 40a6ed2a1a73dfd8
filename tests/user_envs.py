"""User environment classes for the episode tests (named ``user_envs:Class`` on the command
line; tests/ is on every test process's PYTHONPATH)."""

from __future__ import annotations

import re


class CountDown:
    """Answers each model turn with the number one lower until 0; the reward is 1 when a model
    turn held the digit 7 (something a tiny model hits). A digit ends a model turn."""

    stop = tuple("0123456789")
    gives_reward = True

    def __init__(self, start: int = 3) -> None:
        self.left = start
        self.reward = 0.0

    def reset(self, row: dict) -> str:
        return f"Count: {row['prompt']}"

    def step(self, model_text: str):
        if "7" in model_text:
            self.reward = 1.0
        self.left -= 1
        if self.left <= 0 or re.search(r"\bstop\b", model_text):
            return None, self.reward, True
        return str(self.left), None, False


class LongFirstPrompt:
    """Starts every episode from ``length`` characters whatever the row's prompt (the tiny
    character tokenizer: that many tokens), and counts the instances made and closed in this
    process, so a check that plays no episode can be shown to close every one it opened."""

    made = 0
    closed = 0

    def __init__(self, length: int = 100) -> None:
        type(self).made += 1
        self.length = length

    def reset(self, row: dict) -> str:
        return "x" * self.length

    def step(self, model_text: str):
        return None, None, True

    def close(self) -> None:
        type(self).closed += 1


class ScriptedPython:
    """The built-in Python tool, whose first call runs ``code`` whatever the model wrote (a tiny
    random model never writes a tool call): the sandbox joined into a real training run."""

    def __init__(self, code: str = "import os\nprint('uid', os.getuid())") -> None:
        from rlvr.envs.python_tool import PythonToolEnv

        self.tool, self.code, self.turn = PythonToolEnv(instructions=False), code, 0
        self.stop = tuple("0123456789abcdefghijklmnopqrstuvwxyz")  # a model turn ends soon

    def reset(self, row: dict) -> str:
        return self.tool.reset(row)

    def step(self, model_text: str):
        self.turn += 1
        if self.turn == 1:
            return self.tool.step(f"<python>{self.code}</python>")
        return None, None, True
