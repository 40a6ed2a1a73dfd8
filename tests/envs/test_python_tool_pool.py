"""The Python tool under a step's load (issue #57 item 11): waiting for a turn to run is not an
environment failure, every call is timed from the program's own start, and calls made back to
back from fresh threads (as every environment call is, rlvr.envs.contain) all succeed.

Each test goes through the project's entry points: env_factory("python") and step() under
call_all, as rollout/episodes.py runs them."""

from __future__ import annotations

import pytest

from rlvr.envs import env_factory
from rlvr.envs.contain import call_all

LOOP = "<python>while True:\n    pass</python>"


def _step_all(n: int, kwargs: dict, env_timeout_s: float, text: str = LOOP):
    make = env_factory("python", kwargs)
    envs = [make() for _ in range(n)]
    for env in envs:
        env.reset({"prompt": "q"})
    return call_all([lambda e=env: e.step(text) for env in envs], env_timeout_s)


def test_32_looping_snippets_each_answer_timed_out_and_none_fails():
    # the defaults: a 5 s tool limit, env.timeout_s 30 s (the old 4-worker pool: 8 of 32 failed)
    outs = _step_all(32, {}, 30.0)
    failed = [o.error for o in outs if not o.ok]
    assert failed == []
    assert all("timed out" in o.value[0] for o in outs), [o.value[0] for o in outs]


def test_16_episodes_at_a_1s_tool_limit_none_fails():
    # a step's env.timeout_s leaves room for one tool call and its start, not for a queue
    outs = _step_all(16, {"timeout_s": 1.0}, 4.0)
    failed = [o.error for o in outs if not o.ok]
    assert failed == []
    assert all("timed out" in o.value[0] for o in outs), [o.value[0] for o in outs]


def test_16_episodes_stalled_on_a_fifo_none_fails():
    # issue #58: a FIFO stalled the old workers until 12 of 16 episodes failed and the run stopped
    fifo = "<python>import os\nos.mkfifo('stall')\nopen('stall').read()</python>"
    outs = _step_all(16, {"timeout_s": 1.0}, 4.0, fifo)
    assert [o.error for o in outs if not o.ok] == []
    assert all("timed out" in o.value[0] for o in outs), [o.value[0] for o in outs]


def test_back_to_back_calls_from_fresh_threads_all_succeed():
    make = env_factory("python", {})
    env = make()
    env.reset({"prompt": "q"})
    answers = []
    for i in range(100):  # each call in a new thread, as call_all makes them
        (out,) = call_all([lambda i=i: env.step(f"<python>print({i} * 2)</python>")], 30.0)
        assert out.ok, out.error
        answers.append(out.value[0])
    assert answers == [f"<output>{i * 2}</output>" for i in range(100)]
    assert env.tool_failures == 0


class _NoKernelSupport:
    """A backend whose probe fails, as every local backend does on a machine with no sandbox."""

    name = "none"

    @classmethod
    def probe(cls) -> str:
        return "user namespaces are off (kernel.unprivileged_userns_clone=0)"


def test_env_name_python_is_refused_where_no_sandbox_works(monkeypatch, caplog):
    from rlvr.config import load_config
    from rlvr.sandbox import SandboxUnavailable, select
    from rlvr.training.preflight.checks import config_problems

    monkeypatch.setattr(
        select, "LOCAL_BACKENDS", {"bwrap": f"{__name__}:_NoKernelSupport", "landlock": "x:Y"}
    )
    select.reset_cache()
    try:
        problems = "\n".join(config_problems(load_config(None, ["env.name=python"])))
        assert "env.name=python runs model-written code and needs a sandbox" in problems
        assert "bwrap: user namespaces are off" in problems
        assert "sandbox.backend=unsafe_local" in problems
        with pytest.raises(SandboxUnavailable, match="env.name=python"):
            env_factory("python", {})
        # said explicitly, the unsafe backend runs, loudly warned
        cfg = load_config(None, ["env.name=python", "sandbox.backend=unsafe_local"])
        assert config_problems(cfg) == []
        assert "NO isolation" in caplog.text
        env = env_factory("python", {"sandbox": "unsafe_local"})()
        assert env.step("<python>print(2+2)</python>")[0] == "<output>4</output>"
    finally:
        monkeypatch.undo()
        select.reset_cache()


def test_rlvr_train_with_the_python_tool_runs_it_in_the_sandbox(tiny_model_dir, tmp_path):
    """A real `rlvr train` process: the run's first lines name the sandbox, and each episode's
    tool turn is the snippet's output from inside it (uid 65534, the trainer's secret unseen)."""
    import json
    import os
    import subprocess
    import sys

    code = "import os\nprint('uid', os.getuid(), os.environ.get('RLVR_FAKE_API_KEY'))"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlvr",
            "train",
            f"model.name_or_path={tiny_model_dir}",
            f"train.output_dir={tmp_path}",
            "train.run_name=pytool",
            "env.name=user_envs:ScriptedPython",
            f"env.kwargs.code={json.dumps(code)}",
            "data.template=chat",
            "data.max_prompt_tokens=128",
            "rollout.max_new_tokens=8",
            "rollout.max_episode_tokens=96",
            "rollout.max_turns=2",
            "algo.prompts_per_step=2",
            "algo.group_size=2",
            "train.max_steps=1",
            "eval.before_after=false",
            "logging.progress=false",
            "logging.samples_every=1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "RLVR_FAKE_API_KEY": "sk-e2e-secret"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = [line for line in proc.stdout.splitlines() if line.startswith("[rlvr] sandbox:")]
    assert first and first[0].startswith("[rlvr] sandbox: bwrap"), proc.stdout[:2000]
    from rlvr.telemetry.samples import samples_path

    samples = [json.loads(x) for x in samples_path(tmp_path / "pytool", 1).read_text().splitlines()]
    env_turns = [t["text"] for s in samples for t in s["turns"] if t["role"] != "model"]
    assert len(env_turns) == 4 and all("uid 65534 None" in t for t in env_turns), env_turns
