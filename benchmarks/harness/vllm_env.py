"""vLLM's virtualenv (``.venv-vllm`` at the repo root, git-ignored), made by ``make setup-vllm``.

The ``rlvr-vllm`` side of a benchmark runs rlvr's own worker with ``rollout.engine=vllm`` in this
venv: vLLM (the CPU build here) is never installed into ``.venv``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from benchmarks.harness.runner import REPO
from benchmarks.harness.trl_env import venv_python

DEFAULT_VENV = REPO / ".venv-vllm"
# Written by the Makefile's setup-vllm once `import vllm, rlvr.rollout.vllm` works in the venv.
STAMP = ".rlvr-vllm-installed"


def setup_command(venv: Path) -> list[str]:
    """``make setup-vllm``, naming the venv when it is not the Makefile's default one."""
    venv = Path(venv).resolve()
    cmd = ["make", "setup-vllm"]
    if venv != DEFAULT_VENV.resolve():
        cmd.append(f"VLLM_VENV={venv}")
    return cmd


def ensure_vllm_env(venv: Path, *, install: bool = True, log=print) -> Path:
    """The Python of a venv holding rlvr and vLLM; created with ``make setup-vllm`` if missing.

    A venv counts as ready when its Python and the stamp ``make setup-vllm`` writes last both
    exist (rerun ``make setup-vllm`` yourself to refresh one). With ``install=False`` a missing
    venv is an error instead.
    """
    venv = Path(venv)
    py = venv_python(venv)
    if py.exists() and (venv / STAMP).exists():
        return py
    cmd = setup_command(venv)
    if not install:
        raise RuntimeError(
            f"the vLLM venv {venv} is missing or incomplete (no {STAMP}); create it with "
            f"`{' '.join(cmd)}` from {REPO}, or rerun without --no-install"
        )
    log(f"[bench] creating the vLLM venv {venv}: {' '.join(cmd)} (several minutes)")
    subprocess.run(cmd, cwd=REPO, check=True)
    if not (py.exists() and (venv / STAMP).exists()):
        raise RuntimeError(f"`{' '.join(cmd)}` finished but {venv / STAMP} is missing")
    return py
