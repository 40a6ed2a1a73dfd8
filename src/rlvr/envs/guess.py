"""Guess the number: an interactive task where the environment alone gives the reward.

The secret is the row's ``answer`` when it is an integer in range, else drawn from the row's
prompt (the same for every sample of a row, so a group shares one prompt). Each model turn's
last integer is its guess; the environment answers "higher" or "lower", and ends the episode
with reward 1 on a right guess. An episode that runs out of turns scores 0.
"""

from __future__ import annotations

import random
import re
import zlib

from rlvr.envs.base import Env

NUMBER = re.compile(r"-?\d+")


class GuessNumberEnv(Env):
    gives_reward = True

    def __init__(self, low: int = 1, high: int = 20) -> None:
        super().__init__()
        if high <= low:
            raise ValueError(f"guess_number: high={high} must be > low={low}")
        self.low, self.high = low, high
        self.secret = low

    def reset(self, row: dict) -> str:
        answer = str(row.get("answer", "")).strip()
        if answer.lstrip("-").isdigit() and self.low <= int(answer) <= self.high:
            self.secret = int(answer)
        else:
            seed = zlib.crc32(str(row.get("prompt", "")).encode())
            self.secret = random.Random(seed).randint(self.low, self.high)
        return (
            f"I am thinking of a whole number from {self.low} to {self.high}. Guess it: answer "
            "with one number. I will say higher or lower."
        )

    def step(self, model_text: str) -> tuple[str | None, float | None, bool]:
        numbers = NUMBER.findall(model_text)
        if not numbers:
            return "Say one number.", None, False
        guess = int(numbers[-1])
        if guess == self.secret:
            return None, 1.0, True
        return ("Higher." if guess < self.secret else "Lower."), None, False
