"""The sandbox's interface: what a call may use (`Limits`), what comes back (`Result`), and the
protocol every backend implements (`Sandbox`).

A backend runs one program per call, in a fresh working folder that is the program's cwd and
holds the call's ``files``; its output comes back through pipes (never a path the program
controls), each stream cut at ``Limits.output_bytes``. ``argv[0] == "python3"`` names the
sandbox's Python interpreter (rlvr.sandbox.interpreter): the trainer's own interpreter with
``-I -S``, so only the standard library is importable.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Protocol, runtime_checkable

# The names Result.limit takes: which limit ended the program or cut its output.
LIMIT_NAMES = ("wall", "cpu", "memory", "processes", "files", "write", "output")


class SandboxUnavailable(RuntimeError):
    """No backend of the requested kind works on this machine; the message says what failed,
    how to fix it, and that ``sandbox.backend=unsafe_local`` exists (and is unsafe)."""


@dataclass(frozen=True)
class Limits:
    """What one call may use. Each limit holds for the whole process tree the program starts
    where the backend can enforce it so (docs/sandbox.md says which backend holds which)."""

    wall_s: float = 10.0  # the whole call; the whole process tree is killed at the deadline
    cpu_s: float = 10.0
    memory_mb: int = 512  # summed over the process tree
    processes: int = 32
    write_bytes: int = 16 * 2**20  # the working folder
    files: int = 256  # files created in a call
    output_bytes: int = 64 * 2**10  # stdout and stderr each; beyond: truncated, flagged

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"Limits.{f.name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class Result:
    """One call's outcome."""

    returncode: int | None  # None when the sandbox killed it
    stdout: str
    stderr: str
    timed_out: bool
    limit: str | None  # which limit (LIMIT_NAMES) ended or cut it, or None
    wall_s: float
    backend: str

    @property
    def ok(self) -> bool:
        """Exit code 0 with no limit reached."""
        return self.returncode == 0 and self.limit is None


@runtime_checkable
class Sandbox(Protocol):
    """A backend. ``run`` is thread-safe: the Python tool calls it from many threads at once."""

    name: str

    def run(
        self,
        argv: Sequence[str],
        *,
        files: Mapping[str, str | bytes] = ...,
        stdin: str | bytes = b"",
        limits: Limits = ...,
    ) -> Result: ...


def check_files(files: Mapping[str, str | bytes]) -> dict[str, bytes]:
    """``files`` as relative paths inside the working folder -> bytes; a path that is absolute,
    climbs out (``..``) or is empty is refused."""
    out = {}
    for name, content in files.items():
        parts = name.split("/")
        if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(
                f"sandbox file name {name!r}: must be a relative path inside the folder"
            )
        out[name] = content.encode() if isinstance(content, str) else bytes(content)
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def namespace_tag() -> str:
    """Who can judge a folder's pid: this machine and this pid namespace (8 hex digits). A pid
    means nothing in another pid namespace (a container) or on another machine sharing the temp
    folder (TMPDIR on a shared disk): there a live trainer's pid looks like a dead one's."""
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = 0
    return hashlib.sha256(f"{socket.gethostname()}:{ns}".encode()).hexdigest()[:8]


def process_folder(kind: str, tmp: str | None = None) -> str:
    """A new folder ``<tmp>/rlvr-<kind>-<pid>-<tag>-XXXXXXXX`` (``tmp``: by default the
    process's temporary folder) for this process's sandbox, made
    after removing the folders of processes that are gone: atexit removes a backend's folder at
    a normal exit, but nothing does after a SIGKILL (a preempted or OOM-killed trainer). Only
    this user's folders whose name carries this machine's and pid namespace's ``tag``
    (``namespace_tag``) and a pid no process has are removed."""
    tmp, tag = tmp or tempfile.gettempdir(), namespace_tag()
    prefix = f"rlvr-{kind}-"
    with contextlib.suppress(OSError):
        for name in os.listdir(tmp):
            pid, _, rest = (
                name[len(prefix) :].partition("-") if name.startswith(prefix) else ("",) * 3
            )
            if not pid.isdigit() or not rest.startswith(f"{tag}-"):
                continue
            if int(pid) == os.getpid() or pid_alive(int(pid)):
                continue
            path = os.path.join(tmp, name)
            with contextlib.suppress(OSError):
                if os.lstat(path).st_uid == os.geteuid():
                    shutil.rmtree(path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-{tag}-", dir=tmp)
