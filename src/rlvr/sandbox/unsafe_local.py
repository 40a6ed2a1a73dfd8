"""``sandbox.backend=unsafe_local``: the program runs as the trainer's user, on the trainer's
machine, with nothing between them. NOT a sandbox: it reads the trainer's files and
environment-free but readable secrets, opens sockets, signals the trainer, and writes wherever
the trainer may. Only for code you trust, or on a throwaway machine where no backend runs.

What it does keep: a fresh temporary folder as cwd, an environment with nothing of the
trainer's, per-process limits (address space, CPU time, file size, through ``prlimit``), the
session's processes killed at the deadline, output cut at ``output_bytes``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence

from rlvr.sandbox.base import Limits, Result, check_files
from rlvr.sandbox.interpreter import resolve_argv
from rlvr.sandbox.process import decode, run_process


# The environment every backend's program gets: constants, nothing of the trainer's.
def program_env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}


def prlimit_argv(limits: Limits, *, processes: bool) -> list[str]:
    """``prlimit`` options for one process's share of ``limits``."""
    mem = limits.memory_mb * 2**20
    cpu = max(1, int(limits.cpu_s + 0.999))
    out = [
        "prlimit",
        f"--as={mem}",
        f"--cpu={cpu}:{cpu + 1}",
        f"--fsize={limits.write_bytes}",
        "--core=0",
    ]
    if processes:
        out.append(f"--nproc={limits.processes}")
    return [*out, "--"]


def limit_from_exit(returncode: int | None, limits: Limits, cpu_used: float | None) -> str | None:
    """The limit a signal death points at: SIGXCPU (CPU), SIGXFSZ (a file over write_bytes)."""
    if returncode is None:
        return None
    if returncode in (-24, 128 + 24) or (cpu_used is not None and cpu_used >= limits.cpu_s):
        return "cpu"
    if returncode in (-25, 128 + 25):
        return "write"
    return None


def count_files(folder: str) -> tuple[int, int]:
    """Files and bytes under ``folder`` (not following links)."""
    n = size = 0
    for root, dirs, names in os.walk(folder):
        for name in names + dirs:
            n += 1
            with contextlib.suppress(OSError):
                size += os.lstat(os.path.join(root, name)).st_size
    return n, size


class UnsafeLocalSandbox:
    name = "unsafe_local"

    def run(
        self,
        argv: Sequence[str],
        *,
        files: Mapping[str, str | bytes] = {},  # noqa: B006 - read only
        stdin: str | bytes = b"",
        limits: Limits = Limits(),  # noqa: B008 - frozen
    ) -> Result:
        contents = check_files(files)
        folder = tempfile.mkdtemp(prefix="rlvr-unsafe-")
        try:
            for name, data in contents.items():
                path = os.path.join(folder, name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(data)
            given = count_files(folder)[0]
            cmd = [*prlimit_argv(limits, processes=False), *resolve_argv(argv)]
            raw = run_process(
                cmd,
                stdin=stdin.encode() if isinstance(stdin, str) else bytes(stdin),
                wall_s=limits.wall_s,
                output_bytes=limits.output_bytes,
                cwd=folder,
                env=program_env(folder),
            )
            n, size = count_files(folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        limit = "wall" if raw.timed_out else limit_from_exit(raw.returncode, limits, None)
        if limit is None and n - given > limits.files:
            limit = "files"
        if limit is None and size > limits.write_bytes:
            limit = "write"
        if limit is None and raw.output_cut:
            limit = "output"
        return Result(
            raw.returncode,
            decode(raw.stdout),
            decode(raw.stderr),
            raw.timed_out,
            limit,
            raw.wall_s,
            self.name,
        )
