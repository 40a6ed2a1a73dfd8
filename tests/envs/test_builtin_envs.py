"""The built-in environments: the calculator (parsed, never evaluated as Python), the Python tool
in the sandbox (no network, no writes outside its folder, limits, truncation), and
guess-the-number; env.name resolution and the config refusals."""

from __future__ import annotations

import os
import time

import pytest

from rlvr.config import load_config
from rlvr.envs import env_class, env_factory
from rlvr.envs.calculator import CalculatorEnv, calculate
from rlvr.envs.guess import GuessNumberEnv
from rlvr.envs.python_tool import PythonToolEnv, run_python


def test_calculator_parses_and_never_evaluates():
    assert calculate("12*(3+4)") == "84"
    assert calculate("7/2") == "7/2"
    assert calculate("1/0").startswith("error")
    assert calculate("__import__('os').system('true')").startswith("error")
    env = CalculatorEnv()
    assert "<calc>" in env.reset({"prompt": "What is 123*45?"})
    assert env.step("Let me compute <calc>123*45</calc>") == ("<result>5535</result>", None, False)
    assert env.step("<calc>2**8</calc>")[0].startswith("<result>error")
    assert env.step("The answer is 5535.") == (None, None, True)
    assert (env.tool_calls, env.tool_failures) == (2, 1)


def test_guess_number_gives_its_own_reward():
    env = GuessNumberEnv(low=1, high=20)
    env.reset({"prompt": "p", "answer": "13"})
    assert env.step("I guess 7") == ("Higher.", None, False)
    assert env.step("then 15") == ("Lower.", None, False)
    assert env.step("no idea") == ("Say one number.", None, False)
    assert env.step("13") == (None, 1.0, True)
    other = GuessNumberEnv()
    other.reset({"prompt": "same row"})
    again = GuessNumberEnv()
    again.reset({"prompt": "same row"})
    assert other.secret == again.secret  # a row's group shares its secret (and its prompt)


def test_python_tool_runs_code_and_returns_its_output():
    out = run_python("print(sum(range(10)))", 5.0, 512, 1000)
    assert out == {"ok": True, "output": "45\n", "timed_out": False, "limit": None}
    env = PythonToolEnv()
    assert env.step("<python>print(6*7)</python>") == ("<output>42</output>", None, False)
    assert env.step("The answer is 42") == (None, None, True)


def test_python_tool_has_no_network():
    code = "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=2)"
    out = run_python(code, 5.0, 512, 1000)
    assert not out["ok"] and "Error" in out["output"], out  # its own loopback, nothing on it
    out = run_python(
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9', timeout=2)",
        5.0,
        512,
        20000,
    )
    assert not out["ok"] and "URLError" in out["output"], out


def test_python_tool_writes_nothing_outside_its_folder(tmp_path):
    target = tmp_path / "outside.txt"
    for code in (
        f"open({str(target)!r}, 'w').write('x')",
        f"import os\nos.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)",
        f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')",
        f"import os\nos.mkdir({str(tmp_path / 'd')!r})",
        "import subprocess\nsubprocess.run(['touch', '/tmp/rlvr-pytool-escape'], check=True)",
    ):
        out = run_python(code, 5.0, 512, 2000)
        assert not out["ok"], code
        assert "Error" in out["output"], (code, out)
    assert not target.exists() and not (tmp_path / "d").exists()
    assert not os.path.exists("/tmp/rlvr-pytool-escape")
    inside = run_python(
        "open('mine.txt', 'w').write('hi')\nprint(open('mine.txt').read())", 5.0, 512, 100
    )
    assert inside == {"ok": True, "output": "hi\n", "timed_out": False, "limit": None}


def test_python_tool_limits_time_memory_and_output():
    t = time.monotonic()
    out = run_python("while True:\n    pass", 1.0, 512, 100)
    assert out["timed_out"] and "[timed out after 1.0 s]" in out["output"]
    assert time.monotonic() - t < 8
    out = run_python("x = bytearray(1024 ** 3)", 5.0, 256, 1000)
    assert not out["ok"]
    assert "[memory limit: 256 MB]" in out["output"] or "MemoryError" in out["output"], out
    out = run_python("print('y' * 500)", 5.0, 512, 50)
    assert out["output"] == "y" * 50 + "\n[output truncated]"


def test_env_name_resolution():
    assert env_class("calculator") is CalculatorEnv
    assert env_class("guess_number") is GuessNumberEnv
    assert env_class("user_envs:CountDown").__name__ == "CountDown"
    with pytest.raises(ValueError, match="env.name='nope:Missing'"):
        env_class("nope:Missing")
    with pytest.raises(ValueError, match="env.kwargs for env.name='guess_number'"):
        env_factory("guess_number", {"bogus": 1})
    make = env_factory("guess_number", {"high": 5})
    assert make() is not make() and make().high == 5  # a fresh instance per episode


def test_config_refuses_what_episodes_do_not_support_yet():
    from rlvr.training.preflight.checks import config_problems

    cfg = load_config(
        None,
        [
            "env.name=calculator",
            "rollout.tensor_parallel_size=2",
            "rollout.max_staleness=1",
            "data.template=r1",
            "reward.overlong_buffer=4",
            "algo.objective=psgrpo_steps",
            "algo.psgrpo.prm=toy_rewards:count_sevens",
        ],
    )
    text = "\n".join(config_problems(cfg))
    for knob in (
        "rollout.tensor_parallel_size>1 with env.name: not supported yet",
        "rollout.max_staleness=1 with env.name",
        "data.template=r1 with env.name",
        "reward.overlong_buffer with env.name",
        "algo.objective=psgrpo_steps with env.name: not supported yet",
    ):
        assert knob in text
    assert config_problems(load_config(None, ["env.name=calculator"])) == []
    # both engines and the rollout server play episodes (one request per turn)
    for engine in ("rollout.engine=vllm", "rollout.engine=hf", "rollout.mode=server"):
        assert config_problems(load_config(None, ["env.name=calculator", engine])) == []
    bad = load_config(None, ["env.name=user_envs:NoSuchClass"])
    assert "env.name='user_envs:NoSuchClass'" in "\n".join(config_problems(bad))


@pytest.mark.parametrize("source", ["psgrpo_steps", "prm_dense"])
def test_gspo_token_takes_episodes_only_where_its_advantage_source_does(source):
    """gspo_token composes another objective's advantages: with a PRM source the PRM would
    score whole episodes (tool output included), so it is refused as the source itself is."""
    from rlvr.training.preflight.checks import config_problems

    prm = ["algo.psgrpo.prm=toy_rewards:count_sevens", "env.name=calculator"]
    cfg = load_config(
        None, [*prm, "algo.objective=gspo_token", f"algo.gspo_token.advantages={source}"]
    )
    text = "\n".join(config_problems(cfg))
    assert "algo.objective=gspo_token with env.name: not supported yet" in text
    assert f"algo.gspo_token.advantages={source} with env.name" in text
    grpo = load_config(None, [*prm, "algo.objective=gspo_token", "algo.gspo_token.advantages=grpo"])
    assert config_problems(grpo) == []


def test_the_engine_context_holds_a_whole_episode_and_one_more_turn():
    """vLLM refuses a prompt + max_new_tokens over its max_model_len: a late turn's prompt is
    the episode so far (up to rollout.max_episode_tokens after the prompt), and it may still ask
    rollout.max_new_tokens before the episode's budget cuts it."""
    from rlvr.rollout.vllm_setup import max_model_len_for

    knobs = ["data.max_prompt_tokens=64", "rollout.max_new_tokens=16", "eval.max_new_tokens=8"]
    assert max_model_len_for(load_config(None, knobs)) == 64 + 16
    episodes = [*knobs, "env.name=calculator", "rollout.max_episode_tokens=100"]
    assert max_model_len_for(load_config(None, episodes)) == 64 + 100 + 16


def test_auto_picks_vllm_for_episodes_where_it_is_installed(monkeypatch):
    import rlvr.rollout.builder as builder

    cfg = load_config(None, ["env.name=calculator"])
    monkeypatch.setattr(builder, "vllm_available", lambda: True)
    assert builder.engine_for(cfg) == "vllm"
    monkeypatch.setattr(builder, "vllm_available", lambda: False)
    assert builder.engine_for(cfg) == "hf"
