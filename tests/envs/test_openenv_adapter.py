"""The OpenEnv adapter on a real OpenEnv environment (openenv-core's echo template), in process
and through OpenEnv's own client against its own server on a local port: the Action and
Observation mapping, the reset seed, and errors that name the class and the field."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

from rlvr.config import load_config
from rlvr.envs.base import EnvError
from rlvr.envs.openenv_adapter import OpenEnvAdapter, row_seed
from rlvr.envs.registry import env_class, env_factory
from rlvr.training.preflight.checks import config_problems

ECHO_ENV = "openenv:echo_env.server.echo_env_environment:EchoEnvironment"


def test_echo_environment_in_process(openenv_echo):
    env = env_factory(ECHO_ENV, {})()
    assert env.action_cls.__name__ == "EchoAction" and env.action_field == "message"
    # the row's prompt, then the reset observation's only text field
    assert env.reset({"prompt": "Say hi."}) == "Say hi.\n\nEcho Env environment ready!"
    assert env.step("hello") == ("hello", pytest.approx(0.5), False)  # 0.1 per character
    assert env.step("") == ("", 0.0, False)
    env.close()
    only_row = env_factory(ECHO_ENV, {"prompt": "row"})()
    assert only_row.reset({"prompt": "Say hi."}) == "Say hi."
    # a non-text field given by name is written as JSON
    counted = env_factory(ECHO_ENV, {"observation_field": "message_length"})()
    counted.reset({"prompt": "x"})
    assert counted.step("four") == ("4", pytest.approx(0.4), False)


def test_bad_fields_and_classes_are_named(openenv_echo):
    with pytest.raises(
        ValueError,
        match=r"action_field='text': EchoAction has no such field \(fields: \['message'\]\)",
    ):
        env_factory(ECHO_ENV, {"action_field": "text"})
    with pytest.raises(
        ValueError, match=r"observation_field='output': EchoObservation has no such field"
    ):
        env_factory(ECHO_ENV, {"observation_field": "output"})
    with pytest.raises(ValueError, match="not a subclass of OpenEnv's Environment"):
        env_factory("openenv:echo_env.models:EchoAction", {})
    with pytest.raises(ValueError, match="ModuleNotFoundError"):
        env_class("openenv:no_such_module:Env")
    with pytest.raises(ValueError, match="env_kwargs for EchoEnvironment"):
        env_factory(ECHO_ENV, {"env_kwargs": {"level": 2}})
    with pytest.raises(ValueError, match="exactly one of"):
        env_factory("openenv", {})
    with pytest.raises(ValueError, match="action_field is needed with env.kwargs.base_url"):
        env_factory("openenv", {"base_url": "http://127.0.0.1:1"})


class TwoTexts(Action):
    command: str
    note: str = ""


class TwoObs(Observation):
    board: str = ""
    hint: str = ""


class SeededEnv(Environment[TwoTexts, TwoObs, State]):
    """No annotations on step: the Action and Observation classes come from the generics."""

    def __init__(self, size: int = 3):
        super().__init__()
        self.size, self.seen_seed = size, None

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.seen_seed = seed
        return TwoObs(board=f"board {seed % 100} of {self.size}", hint=str(kwargs.get("level")))

    def step(self, action, timeout_s=None, **kwargs):
        done = action.command == "quit"
        return TwoObs(board=action.command.upper(), hint="h", reward=True, done=done)

    @property
    def state(self):
        return State()


def test_several_text_fields_need_a_name_and_the_seed_comes_from_the_row():
    target = f"openenv:{__name__}:SeededEnv"
    with pytest.raises(ValueError, match=r"TwoTexts has 2 text fields \['command', 'note'\]"):
        env_factory(target, {})
    with pytest.raises(ValueError, match=r"TwoObs has 2 text fields \['board', 'hint'\]"):
        env_factory(target, {"action_field": "command"})
    make = env_factory(
        target,
        {
            "action_field": "command",
            "observation_field": "board",
            "env_kwargs": {"size": 5},
            "reset_kwargs": {"level": 2},
            "prompt": "observation",
        },
    )
    a, b = make(), make()
    row = {"prompt": "Play."}
    assert a.reset(row) == b.reset(row)  # the samples of a row start from the same state
    assert a._env.seen_seed == row_seed(row) and a._env.size == 5
    assert a.reset({"prompt": "Play.", "seed": 7}) == "board 7 of 5"
    assert a.step("go") == ("GO", 1.0, False)  # a bool reward is a number
    assert a.step("quit") == (None, 1.0, True)  # done: no observation turn


def test_a_reset_kwarg_the_environment_does_not_take_is_named(openenv_echo):
    env = env_factory(ECHO_ENV, {"reset_kwargs": {"level": 2}})()
    with pytest.raises(
        EnvError, match=r"reset_kwargs \['level'\]: EchoEnvironment.reset takes \[\]"
    ):
        env.reset({"prompt": "x"})


def test_echo_server_through_openenv_client(echo_server):
    make = env_factory("openenv", {"base_url": echo_server, "action_field": "message"})

    def episode(i: int):
        env = make()
        try:
            return env.reset({"prompt": f"Q{i}"}), env.step("ab" * i)
        finally:
            env.close()

    with ThreadPoolExecutor(4) as pool:  # concurrent sessions, as episodes run
        got = list(pool.map(episode, range(4)))
    for i, (prompt, (obs, reward, done)) in enumerate(got):
        assert prompt == f"Q{i}\n\nEcho Env environment ready!"
        assert obs == "ab" * i and reward == pytest.approx(0.2 * i) and done is False
    wrong = env_factory("openenv", {"base_url": echo_server, "action_field": "text"})()
    wrong.reset({"prompt": "x"})
    with pytest.raises(EnvError, match=r"step\(text=<model text>\).*VALIDATION_ERROR"):
        wrong.step("hi")
    wrong.close()


def test_config_accepts_the_openenv_forms(openenv_echo):
    ok = load_config(None, [f"env.name={ECHO_ENV}"])
    assert config_problems(ok) == []
    bare = load_config(None, ["env.name=openenv"])
    assert any("env.kwargs.base_url" in p for p in config_problems(bare))
    bad = load_config(None, ["env.name=openenv:echo_env.models:EchoAction"])
    assert any("not a subclass of OpenEnv's Environment" in p for p in config_problems(bad))


def test_missing_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "openenv.core.env_server.interfaces", None)
    with pytest.raises(ValueError, match=r"rlvr\[openenv\]"):
        env_class("openenv:anything:Env")
    with pytest.raises(ValueError, match=r"rlvr\[openenv\]"):
        OpenEnvAdapter(base_url="http://127.0.0.1:1", action_field="message")
