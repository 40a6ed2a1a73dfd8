"""Run one Python snippet of the Python tool: called inside a sandbox worker (a killable child of
the trainer, rlvr.rewards.sandbox), which starts a fresh interpreter for the snippet.

The snippet's interpreter (``python -I -S``: no site, no user paths, no environment variables
of ours) runs in a new empty directory under limits: address space (``memory_mb``), CPU time
and wall time (``timeout_s``), size of any file it writes (the captured output included). Before
the snippet runs, an audit hook (PEP 578, which cannot be removed) refuses network sockets,
writes and removals outside the directory, new processes, signals and native libraries (ctypes).
Reading files is allowed. Its output (stdout and stderr together) comes back cut to
``max_output_chars``; the directory is removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

# Runs first in the snippet's interpreter; the snippet's code is read from the file 'snippet.py'.
BOOT = r"""
import os, sys
_DIR = os.path.realpath(os.getcwd())
_W = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_DENY = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
         "os.fork", "os.forkpty", "os.kill", "os.killpg", "ctypes.", "os.putenv", "os.unsetenv",
         "pty.", "sys.setprofile", "sys.settrace")
_PATHS = ("os.remove", "os.rename", "os.replace", "os.mkdir", "os.rmdir", "os.chmod",
          "os.chown", "os.link", "os.symlink", "os.truncate", "os.utime", "shutil.rmtree",
          "shutil.copyfile", "shutil.move", "os.chdir", "os.chroot", "os.mkfifo", "os.mknod")

def _inside(path):
    if isinstance(path, int):
        return True
    try:
        p = os.path.realpath(os.fsdecode(os.fspath(path)))
    except (TypeError, ValueError):
        return False
    return p == _DIR or p.startswith(_DIR + os.sep)

def _hook(event, args):
    if event.startswith(_DENY):
        raise PermissionError(f"the Python tool does not allow {event}")
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, 0))[:3]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _W)
        if writing and not _inside(path):
            raise PermissionError(f"the Python tool writes only inside its directory: {path}")
    elif event in _PATHS:
        for a in args[:2]:
            if isinstance(a, (str, bytes, os.PathLike)) and not _inside(a):
                raise PermissionError(f"the Python tool may not {event} outside its directory: {a}")

sys.addaudithook(_hook)
del _hook
_code = open("snippet.py").read()
exec(compile(_code, "<tool>", "exec"), {"__name__": "__main__"})
"""


def run_snippet(
    code: str, timeout_s: float = 5.0, memory_mb: int = 512, max_output_chars: int = 2000
) -> dict:
    """Run ``code``; returns ``{"ok": exit code 0 and in time, "output": text, "timed_out"}``."""
    workdir = tempfile.mkdtemp(prefix="rlvr-pytool-")
    out_path = os.path.join(workdir, ".output")
    try:
        with open(os.path.join(workdir, "snippet.py"), "w") as f:
            f.write(code)
        limit_bytes = memory_mb * 1024 * 1024
        file_bytes = max(64 * 1024, 4 * max_output_chars)

        def limits() -> None:  # in the snippet's process, before it starts
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
            cpu = max(1, int(timeout_s) + 1)
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.setsid()

        timed_out = False
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", BOOT],
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={"PATH": "/usr/bin:/bin", "PYTHONIOENCODING": "utf-8"},
                preexec_fn=limits,  # noqa: PLW1509 - the child is a fresh interpreter, no threads
            )
            try:
                code_ = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(proc.pid, 9)
                code_ = proc.wait()
        with open(out_path, "rb") as f:
            text = f.read(4 * max_output_chars).decode("utf-8", "replace")
        if len(text) > max_output_chars:
            text = text[:max_output_chars] + "\n[output truncated]"
        if timed_out:
            text += f"\n[timed out after {timeout_s} s]"
        elif code_ < 0:
            text += f"\n[killed by signal {-code_}]"
        return {"ok": code_ == 0 and not timed_out, "output": text, "timed_out": timed_out}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
