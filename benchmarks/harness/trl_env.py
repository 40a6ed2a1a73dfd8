"""TRL's own virtualenv (``benchmarks/.venv-trl``, git-ignored): TRL is never an rlvr dependency."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# torch first and pinned: the CPU build (an unpinned torch pulls a multi-GB CUDA build).
TORCH_REQUIREMENT = "torch==2.13.0"
# math-verify: rlvr's maths grader (imported from src/ via PYTHONPATH) uses it for its symbolic stage.
REQUIREMENTS = ("trl==1.16.0", "math-verify==0.9.0", "psutil>=5.9")
# PyPI's builds of these do not import beside the CPU torch (see ENVIRONMENT.md).
INCOMPATIBLE = ("torchvision", "torchaudio", "torchcodec")
STAMP = ".bench-requirements"


def venv_python(venv: Path) -> Path:
    return Path(venv) / "bin" / "python"


def ensure_trl_env(venv: Path, *, install: bool = True, log=print) -> Path:
    """The Python of a venv holding TRL; created and filled on first use. Returns its path.

    A stamp file records what was installed, so later runs start at once. With ``install=False``
    a missing or outdated venv is an error instead.
    """
    venv = Path(venv)
    py = venv_python(venv)
    want = "\n".join((TORCH_REQUIREMENT, *REQUIREMENTS)) + "\n"
    stamp = venv / STAMP
    if py.exists() and stamp.exists() and stamp.read_text() == want:
        return py
    if not install:
        raise RuntimeError(
            f"the TRL venv {venv} is missing or outdated; rerun without --no-install to create it"
        )
    if not py.exists():
        log(f"[bench] creating the TRL venv {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    log(f"[bench] installing {TORCH_REQUIREMENT} {' '.join(REQUIREMENTS)} into {venv}")
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, TORCH_REQUIREMENT], check=True)
    subprocess.run([*pip, TORCH_REQUIREMENT, *REQUIREMENTS], check=True)
    subprocess.run(
        [str(py), "-m", "pip", "uninstall", "-q", "-y", *INCOMPATIBLE],
        check=False,  # usually none of them is installed
        capture_output=True,
    )
    subprocess.run([str(py), "-c", "import trl, math_verify, psutil"], check=True)
    stamp.write_text(want)
    return py
