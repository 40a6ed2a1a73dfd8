"""The attack suite (tests/sandbox/attacks.py) sent as the model's answer through the code reward:
each attack program is the reply's fenced block, graded by RewardRunner's ``code`` reward on
every strong backend that works here, once in the harness (a call test) and once as a script
(a stdin/stdout test).

Each scores 0 (it defines no ``f`` and prints no answer: its honest score), is scored (a valid
sample, not a reward failure), ends within its sample's time, and is contained: the sandbox
suite's ``watched`` fixture checks from outside that the trainer's planted files, environment,
memory canary, signal handler, listeners and /tmp are unchanged and that no attack process
outlived the call; every run's output is checked for ``ESCAPED`` lines (beyond a backend's known
gaps, the suite's ``KNOWN_GAPS``) and leaked secrets.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from rlvr.rewards.runner import RewardRunner
from rlvr.sandbox import default_limits, get_sandbox

# the sandbox suite's attacks and its trainer-side checks, imported, not copied
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sandbox"))
import test_attacks as suite  # noqa: E402
from attacks import ATTACKS, program  # noqa: E402

STRONG = suite.STRONG
_assert_contained, _listener_probe = suite._assert_contained, suite._listener_probe
trainer, watched = suite.trainer, suite.watched  # its fixtures: the trainer's state, checked after

MEMORY_MB = 128
RUNNER_TIMEOUT_S = 8.0  # the code reward gets half: 4 s a sample, 2 s for each of its two runs
ROW = {"tests": [{"call": "f(1)", "expected": 2}, {"stdin": "1\n", "stdout": "2\n"}]}


def recorded(monkeypatch: pytest.MonkeyPatch, backend: str) -> list:
    """The results of every run the backend makes during the test (its outputs and limits)."""
    box = get_sandbox(backend)
    real = box.run
    results: list = []

    def run(*args, **kwargs):
        res = real(*args, **kwargs)
        results.append(res)
        return res

    monkeypatch.setattr(box, "run", run)
    return results


def code_runner(backend: str) -> RewardRunner:
    kwargs = {"backend": backend, "fraction": True, "memory_mb": MEMORY_MB}
    return RewardRunner([{"name": "code", "kwargs": kwargs}], timeout_s=RUNNER_TIMEOUT_S)


def fenced(code: str) -> str:
    return f"Here is f:\n```python\n{code}\n```\n"


@pytest.mark.parametrize("backend", STRONG)
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_as_the_answer_scores_zero_and_is_contained(name, backend, watched, monkeypatch):
    limits = default_limits(memory_mb=MEMORY_MB)
    code = program(name, watched.coords(limits.files, limits.write_bytes, MEMORY_MB))
    runs = recorded(monkeypatch, backend)
    probe = _listener_probe(name, code)
    with code_runner(backend) as rewards:
        start = time.monotonic()
        out = rewards.score_batch(["q"], [fenced(code)], [""], [ROW], [False])
        elapsed = time.monotonic() - start
    assert not (probe() if probe else False), "the trainer reached the sandbox's listener"
    assert out.valid == [True], out.failures  # scored: the attack is its sample's business
    assert out.scores == [0.0], out.infos
    assert [r.backend for r in runs] == [backend, backend]  # the harness run and the script run
    for res in runs:
        _assert_contained(name, res.stdout + res.stderr, res.limit, backend=backend)
    assert elapsed < RUNNER_TIMEOUT_S / 2 + 2.0, elapsed


@pytest.mark.skipif(not STRONG, reason="no strong sandbox backend runs here")
def test_attacks_in_a_batch_mark_only_their_own_samples(watched):
    backend = STRONG[0]
    limits = default_limits(memory_mb=MEMORY_MB)
    coords = watched.coords(limits.files, limits.write_bytes, MEMORY_MB)
    good = "def f(x):\n    return 2 * x\nif __name__ == '__main__':\n    print(f(int(input())))"
    attacks = ["fork_bomb", "memory_held_across_children", "signal_the_trainer", "huge_output"]
    responses = [fenced(good)]
    for name in attacks:
        responses += [fenced(program(name, coords)), fenced(good)]
    n = len(responses)
    with code_runner(backend) as rewards:
        out = rewards.score_batch(["q"] * n, responses, [""] * n, [ROW] * n, [False] * n)
    assert out.valid == [True] * n, out.failures
    assert out.scores == [1.0, 0.0] * len(attacks) + [1.0]
    fork, memory, _, flood = (out.infos[2 * i + 1] for i in range(len(attacks)))
    assert fork["code_timeout"] + fork["code_limit"] >= 1.0
    assert memory["code_limit"] == 1.0 and flood["code_limit"] == 1.0
