from __future__ import annotations

import pytest

from benchmarks.harness.trl_env import REQUIREMENTS, STAMP, TORCH_REQUIREMENT, ensure_trl_env


def test_missing_venv_without_install_is_a_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match="missing or outdated; rerun without --no-install"):
        ensure_trl_env(tmp_path / "venv", install=False)


def test_stamped_venv_is_used_as_is(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / STAMP).write_text("\n".join((TORCH_REQUIREMENT, *REQUIREMENTS)) + "\n")
    assert ensure_trl_env(venv, install=False) == venv / "bin" / "python"
    # a stamp for other pins counts as outdated
    (venv / STAMP).write_text("trl==0.1\n")
    with pytest.raises(RuntimeError, match="outdated"):
        ensure_trl_env(venv, install=False)
