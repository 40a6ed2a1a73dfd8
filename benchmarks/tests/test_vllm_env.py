from __future__ import annotations

import subprocess

import pytest

from benchmarks.harness import vllm_env
from benchmarks.harness.vllm_env import DEFAULT_VENV, REPO, STAMP, ensure_vllm_env, setup_command


def test_missing_venv_without_install_names_make_setup_vllm(tmp_path):
    with pytest.raises(RuntimeError, match="missing or incomplete") as err:
        ensure_vllm_env(tmp_path / "venv", install=False)
    assert "make setup-vllm" in str(err.value)
    assert "--no-install" in str(err.value)


def test_venv_without_stamp_counts_as_missing(tmp_path):
    # a half-finished `make setup-vllm` leaves a python but no stamp
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    with pytest.raises(RuntimeError, match=f"no {STAMP}"):
        ensure_vllm_env(venv, install=False)
    (venv / STAMP).write_text("")
    assert ensure_vllm_env(venv, install=False) == venv / "bin" / "python"


def test_setup_command_names_a_non_default_venv(tmp_path):
    assert setup_command(DEFAULT_VENV) == ["make", "setup-vllm"]
    assert setup_command(tmp_path / "v") == ["make", "setup-vllm", f"VLLM_VENV={tmp_path / 'v'}"]


def test_install_runs_make_from_the_repo_root(tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    calls = []

    def fake_run(cmd, cwd, check):
        calls.append((cmd, cwd, check))
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").write_text("")
        (venv / STAMP).write_text("")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(vllm_env.subprocess, "run", fake_run)
    assert ensure_vllm_env(venv, log=str) == venv / "bin" / "python"
    assert calls == [(["make", "setup-vllm", f"VLLM_VENV={venv}"], REPO, True)]
    # a second call finds the stamp and runs nothing
    assert ensure_vllm_env(venv, log=str) == venv / "bin" / "python"
    assert len(calls) == 1


def test_install_that_leaves_no_stamp_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(
        vllm_env.subprocess, "run", lambda cmd, cwd, check: subprocess.CompletedProcess(cmd, 0)
    )
    with pytest.raises(RuntimeError, match="finished but"):
        ensure_vllm_env(tmp_path / "venv", log=str)
