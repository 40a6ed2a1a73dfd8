"""Loading a verifiers environment leaves the trainer's signal handlers as they were.

verifiers' Environment installs its own SIGINT and SIGTERM handlers when it is built (a teardown,
then exit(143)): inside rlvr that would replace the stop-signal handlers that write a checkpoint
within train.stop_grace_s with an exit that writes none."""

from __future__ import annotations

import signal

import pytest

pytest.importorskip("verifiers")


@pytest.fixture
def own_handlers():
    """A handler of the trainer's own on SIGINT and SIGTERM, the previous ones put back after."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def trainer_handler(signum, frame) -> None:  # never called: only its identity matters
        raise AssertionError("not expected to run")

    for s in before:
        signal.signal(s, trainer_handler)
    yield trainer_handler
    for s, h in before.items():
        signal.signal(s, h)


def test_the_rows_loader_keeps_the_handlers(own_handlers) -> None:
    from rlvr.data.verifiers_rows import verifiers_rows

    train, _ = verifiers_rows("verifiers:user_verifiers_env", num_train=2, num_eval=1, seed=0)
    assert len(train) == 2
    assert signal.getsignal(signal.SIGTERM) is own_handlers
    assert signal.getsignal(signal.SIGINT) is own_handlers


def test_the_agents_loader_keeps_the_handlers(own_handlers) -> None:
    from rlvr.rollout.agents import load_verifiers_environment

    env = load_verifiers_environment("user_verifiers_env", {"n": 3})
    assert type(env).__name__ == "ToolEnv"
    assert signal.getsignal(signal.SIGTERM) is own_handlers
    assert signal.getsignal(signal.SIGINT) is own_handlers
