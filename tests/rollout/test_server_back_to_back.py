"""A run right after a run (issue 51, item 6): two `rlvr train rollout.mode=server` runs one
after the other on the same port, each starting and stopping its own rollout worker. The first
run's connections leave the port in TIME_WAIT; the second must start anyway, not be refused with
"rollout.server_port=... is in use" for the next minute (a requeue, a sweep, a retry)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_support import TINY

from rlvr.rollout.server_launch import free_port

pytestmark = pytest.mark.vllm


def _run(model_dir: Path, out: Path, name: str, port: int) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rlvr", "train", f"model.name_or_path={model_dir}"]
    cmd += [f"train.output_dir={out}", f"train.run_name={name}", "train.max_steps=2"]
    cmd += ["rollout.mode=server", "rollout.engine=vllm", f"rollout.server_port={port}"]
    cmd += ["data.template=none", "data.max_prompt_tokens=32", "rollout.max_new_tokens=8"]
    cmd += ["algo.prompts_per_step=2", "algo.group_size=4", "model.autocast=off"]
    cmd += ["eval.before_after=false", "logging.progress=false", "train.preflight_step=0"]
    cmd += ["reward.specs=[{name: 'toy_rewards:digit_fraction'}]"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def _time_wait_on(port: int) -> bool:
    """Whether a TCP socket on 127.0.0.1:``port`` is in TIME_WAIT (/proc/net/tcp state 06)."""
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return any(
        line.split()[1] == f"0100007F:{port:04X}" and line.split()[3] == "06" for line in lines
    )


def test_two_server_runs_back_to_back_both_train(tmp_path):
    from rlvr.training.tiny import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "model", **TINY)
    port = free_port("127.0.0.1")
    first = _run(model_dir, tmp_path, "first", port)
    assert first.returncode == 0, first.stderr[-3000:]
    # the state the second run meets: the first worker's connections in TIME_WAIT on the port
    assert _time_wait_on(port)
    second = _run(model_dir, tmp_path, "second", port)
    assert second.returncode == 0, second.stderr[-3000:]
    for name in ("first", "second"):
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        assert [m["step"] for m in map(json.loads, lines) if m.get("step", 0) > 0] == [1, 2]
