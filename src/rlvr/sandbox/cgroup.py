"""A cgroup per sandbox call, where the cgroup filesystem is writable: memory summed over the
call's whole process tree, a cap on its processes (threads count), its CPU time summed.

cgroup v1 (a folder per controller: memory, pids, cpuacct) and v2 (one unified folder) are both
handled. The call's groups live under the trainer's own groups, in ``rlvr-sandbox-<pid>-<tag>``
(``tag``: this machine's and pid namespace's, as the sandbox folders have it), and are removed
after the call; what a killed trainer's calls left (processes included) is ended and removed by
the next trainer of the same pid namespace that starts there. The launcher shell joins the groups (writes its pid to each ``cgroup.procs``)
before it execs anything of the program, so every process of the call starts inside.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import signal
import threading
import time
from dataclasses import dataclass

from rlvr.sandbox.base import namespace_tag, pid_alive

ROOT = "/sys/fs/cgroup"
_counter = itertools.count()


def _own_paths() -> dict[str, str]:
    """controller (or "" for v2) -> the trainer's cgroup path, from /proc/self/cgroup."""
    out = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                out[c] = path
    return out


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read_int(path: str) -> int:
    with open(path) as f:
        return int(f.read().split()[0])


@dataclass
class CallGroup:
    """The groups of one call: ``join`` (the cgroup.procs files the launcher writes its pid to)."""

    dirs: dict[str, str]  # "memory" | "pids" | "cpu" -> folder (the same folder under v2)
    v2: bool

    @property
    def join(self) -> list[str]:
        return sorted({os.path.join(d, "cgroup.procs") for d in self.dirs.values()})

    def cpu_s(self) -> float | None:
        d = self.dirs.get("cpu")
        if d is None:
            return None
        try:
            if self.v2:
                with open(os.path.join(d, "cpu.stat")) as f:
                    usage = dict(line.split() for line in f)
                return int(usage["usage_usec"]) / 1e6
            return _read_int(os.path.join(d, "cpuacct.usage")) / 1e9
        except (OSError, KeyError, ValueError):
            return None

    def oom_killed(self) -> bool:
        d = self.dirs.get("memory")
        if d is None:
            return False
        try:
            name = "memory.events" if self.v2 else "memory.oom_control"
            with open(os.path.join(d, name)) as f:
                fields = dict(line.split()[:2] for line in f if line.strip())
            if "oom_kill" in fields:
                return int(fields["oom_kill"]) > 0
            if not self.v2:  # old kernels: the limit was hit
                return _read_int(os.path.join(d, "memory.failcnt")) > 0
        except (OSError, ValueError):
            return False
        return False

    def pids_hit(self) -> bool:
        d = self.dirs.get("pids")
        if d is None:
            return False
        try:
            if self.v2:
                with open(os.path.join(d, "pids.events")) as f:
                    return any(int(line.split()[1]) > 0 for line in f if line.startswith("max"))
            with open(os.path.join(d, "pids.events")) as f:
                return any(int(line.split()[1]) > 0 for line in f if line.startswith("max"))
        except (OSError, ValueError, IndexError):
            return False

    def procs(self) -> list[int]:
        out: set[int] = set()
        for path in self.join:
            with contextlib.suppress(OSError), open(path) as f:
                out.update(int(x) for x in f.read().split())
        # v2 lists a process outside the reader's pid namespace as 0: kill(0) is one's own group
        return sorted(p for p in out if p > 0)

    def kill_all(self, timeout_s: float = 5.0) -> None:
        """SIGKILL every process in the groups until none is left (new ones may be forking)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pids = self.procs()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self) -> None:
        for d in sorted(set(self.dirs.values()), key=len, reverse=True):
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


class Cgroups:
    """The writable controllers of this machine, found once (`find`); ``new_call`` makes a call's."""

    def __init__(self, bases: dict[str, str], v2: bool) -> None:
        self.bases, self.v2 = bases, v2
        self._lock = threading.Lock()

    @classmethod
    def find(cls) -> Cgroups | None:
        """The trainer's per-process folder under each controller it can write, or None."""
        try:
            own = _own_paths()
        except OSError:
            return None
        unified = os.path.join(ROOT, "cgroup.controllers")
        tag = f"rlvr-sandbox-{os.getpid()}-{namespace_tag()}"
        if os.path.exists(unified):  # v2 only
            parent = os.path.join(ROOT, own.get("", "/").lstrip("/"))
            _sweep(parent, v2=True)
            base = os.path.join(parent, tag)
            with contextlib.suppress(OSError):
                with open(unified) as f:
                    have = f.read().split()
                if {"memory", "pids"} <= set(have):
                    os.makedirs(base, exist_ok=True)
                    want = " ".join(f"+{c}" for c in ("memory", "pids", "cpu") if c in have)
                    _write(os.path.join(base, "cgroup.subtree_control"), want)
                    atexit.register(_remove, [base])
                    return cls({"memory": base, "pids": base, "cpu": base}, True)
            return None
        bases = {}
        for ctrl, key in (("memory", "memory"), ("pids", "pids"), ("cpuacct", "cpu")):
            mount = os.path.join(ROOT, ctrl)
            if not os.path.isdir(mount) or ctrl not in own:
                continue
            parent = os.path.join(mount, own[ctrl].lstrip("/"))
            _sweep(parent)
            base = os.path.join(parent, tag)
            try:
                os.makedirs(base, exist_ok=True)
                probe = os.path.join(base, "probe")
                os.makedirs(probe, exist_ok=True)
                os.rmdir(probe)
            except OSError:
                continue
            bases[key] = base
        if "memory" not in bases or "pids" not in bases:
            _remove(bases.values())
            return None
        atexit.register(_remove, list(bases.values()))
        return cls(bases, False)

    def new_call(self, memory_bytes: int, processes: int) -> CallGroup:
        name = f"call-{next(_counter)}"
        if self.v2:
            d = os.path.join(self.bases["memory"], name)
            os.mkdir(d)
            group = CallGroup({"memory": d, "pids": d, "cpu": d}, True)
            _write(os.path.join(d, "memory.max"), str(memory_bytes))
            with contextlib.suppress(OSError):
                _write(os.path.join(d, "memory.swap.max"), "0")
            _write(os.path.join(d, "pids.max"), str(processes))
            return group
        dirs = {}
        try:
            for key, base in self.bases.items():
                dirs[key] = os.path.join(base, name)
                os.mkdir(dirs[key])
            group = CallGroup(dirs, False)
            mem = dirs["memory"]
            _write(os.path.join(mem, "memory.limit_in_bytes"), str(memory_bytes))
            with contextlib.suppress(OSError):  # swap accounting: no memory moved out to swap
                _write(os.path.join(mem, "memory.memsw.limit_in_bytes"), str(memory_bytes))
            with contextlib.suppress(OSError):
                _write(os.path.join(mem, "memory.swappiness"), "0")
            _write(os.path.join(dirs["pids"], "pids.max"), str(processes))
        except OSError:
            CallGroup(dirs, False).remove()
            raise
        return group


def _remove(folders) -> None:
    """This process's groups, once empty (at exit)."""
    for d in folders:
        with contextlib.suppress(OSError):
            os.rmdir(d)


def _sweep(parent: str, v2: bool = False) -> None:
    """End what the calls of trainers that are gone left running (a trainer killed mid-call:
    a program's child in a session of its own outlives it where no pid namespace holds it),
    then remove their groups. Only this pid namespace's groups are judged by their pid: in
    another one (a container on the same cgroup) a live trainer's pid looks like a dead one's."""
    tag = namespace_tag()
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            pid, _, rest = name.removeprefix("rlvr-sandbox-").partition("-")
            if not name.startswith("rlvr-sandbox-") or rest != tag:
                continue
            if not pid.isdigit() or pid_alive(int(pid)):
                continue
            base = os.path.join(parent, name)
            for sub in os.listdir(base):
                d = os.path.join(base, sub)
                if os.path.isdir(d):
                    group = CallGroup({"memory": d, "pids": d, "cpu": d}, v2)
                    group.kill_all(timeout_s=2.0)
                    group.remove()
            with contextlib.suppress(OSError):
                os.rmdir(base)
