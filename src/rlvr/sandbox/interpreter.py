"""What ``python3`` means inside the sandbox, and the files it needs.

The trainer's own interpreter (its real binary, not a venv's link) run with ``-E -s -S``: no
``PYTHON*`` variable is read (the environment is empty anyway), no user site folder, and ``-S``
leaves out site-packages, so only the standard library and the program's own folder are
importable. Not ``-I``: isolated mode also drops the script's folder from ``sys.path``, and a
program of several files in its working folder must import its siblings. Why this one: it is on every machine
the trainer runs on (nothing else to install), it is the version the trainer itself was tested
with, and a program graded here behaves as it would under the trainer's ``python``. The
site-packages folders that sit inside the standard library's folder are hidden as well (an empty
mount over them), so the model cannot even read the trainer's installed packages.

`system_files()` lists what the interpreter loads: its binary, the standard library, and the
shared libraries the binary and the standard library's extension modules link (found once with
``ldd``), with the symlinks on the way (``/lib64/ld-linux-x86-64.so.2`` -> ``/lib/...``,
``/lib`` -> ``usr/lib``) that the dynamic loader follows.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

FLAGS = ("-E", "-s", "-S")


@dataclass(frozen=True)
class SystemFiles:
    executable: str  # the real binary
    read_dirs: tuple[str, ...]  # folders bound read-only (real paths)
    read_files: tuple[str, ...]  # single files bound read-only (real paths)
    symlinks: tuple[tuple[str, str], ...]  # (target, link path), as on the host
    hidden: tuple[str, ...]  # folders inside read_dirs covered by an empty mount


def executable() -> str:
    return os.path.realpath(sys.executable)


def resolve_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``python3`` replaced by the sandbox's interpreter and its flags."""
    argv = list(argv)
    if not argv:
        raise ValueError("sandbox: argv is empty")
    if argv[0] == "python3":
        return [executable(), *FLAGS, *argv[1:]]
    return argv


def reachable_by_others(path: str) -> bool:
    """Every folder on the way traversable by any user (o+x), the file itself o+r."""
    cur = "/"
    for part in [p for p in os.path.dirname(path).split("/") if p]:
        cur = os.path.join(cur, part)
        if not os.stat(cur).st_mode & 0o001:
            return False
    return bool(os.stat(path).st_mode & 0o004)


def traversable_by_others(folder: str) -> bool:
    """Every folder from / down to ``folder`` itself passable by any user (o+x)."""
    cur = "/"
    for part in [p for p in folder.split("/") if p]:
        cur = os.path.join(cur, part)
        if not os.stat(cur).st_mode & 0o001:
            return False
    return True


def _links_on_the_way(path: str, links: dict[str, str], seen: int = 0) -> str:
    """Record each symlink met while resolving ``path`` component by component; the real path."""
    if seen > 40:
        return os.path.realpath(path)
    cur = "/"
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        nxt = os.path.join(cur, part)
        if os.path.islink(nxt):
            target = os.readlink(nxt)
            links[nxt] = target
            rest = "/".join(parts[i + 1 :])
            resolved = os.path.normpath(os.path.join(os.path.dirname(nxt), target))
            return _links_on_the_way(
                os.path.join(resolved, rest) if rest else resolved, links, seen + 1
            )
        cur = nxt
    return cur


def _shared_libraries(binaries: list[str]) -> list[str]:
    """The paths the dynamic loader opens for ``binaries`` (as it names them, links included)."""
    try:
        out = subprocess.run(
            ["ldd", *binaries], capture_output=True, text=True, timeout=60, env={}
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    paths = set()
    for line in out.splitlines():
        m = re.search(r"=>\s*(/\S+)", line) or re.match(r"\s*(/\S+)\s+\(0x", line)
        if m:
            paths.add(m.group(1))
    return sorted(paths)


@functools.cache
def system_files() -> SystemFiles:
    exe = executable()
    # the base interpreter's folders (sysconfig's platstdlib names a venv's own folder)
    stdlib = {os.path.dirname(os.path.realpath(os.__file__))}
    dynload = sorted({os.path.realpath(p) for p in sys.path if p.endswith("lib-dynload")})
    stdlib.update(dynload)
    modules = [f for d in dynload for f in glob.glob(os.path.join(d, "*.so"))]
    links: dict[str, str] = {}
    dirs = set(stdlib)
    for lib in _shared_libraries([exe, *modules]):
        dirs.add(os.path.dirname(_links_on_the_way(lib, links)))
    files = {_links_on_the_way(exe, links)}
    hidden = set()
    for s in stdlib:
        for name in ("site-packages", "dist-packages"):
            if os.path.isdir(os.path.join(s, name)):
                hidden.add(os.path.join(s, name))
    # a folder inside another bound folder needs no bind of its own
    kept = sorted(d for d in dirs if not any(d.startswith(o + "/") for o in dirs if o != d))
    files = {f for f in files if not any(f.startswith(d + "/") for d in kept)}
    links = {p: t for p, t in links.items() if not any(p.startswith(d + "/") for d in kept)}
    return SystemFiles(
        exe,
        tuple(kept),
        tuple(sorted(files)),
        tuple(sorted((t, p) for p, t in links.items())),
        tuple(sorted(hidden)),
    )
