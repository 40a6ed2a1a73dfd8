"""Which ``malloc`` a training process runs with: tcmalloc (or jemalloc) where the machine has one.

Why: on the CPU every tensor comes from ``malloc``. glibc's hands large blocks back to the kernel
as soon as they are freed and takes fresh ones for the next tensor (each page faulted in and
zeroed again), and keeps the rest of its heap in fragments sized like last step's tensors, so a
step is slower and the resident set grows with the number of distinct tensor shapes. tcmalloc
and jemalloc keep freed blocks in size classes and reuse them. On the ``target`` benchmark
workload (``benchmarks/studies/allocator_ab.py``, one seed, 8 steps each) tcmalloc made a step 5% faster
(generation 10%, the update 5%) and the peak 9% lower than glibc's; jemalloc lowered the peak by
11% but slowed the update by 17%, so ``auto`` prefers tcmalloc.

A process cannot change its ``malloc`` once it runs, so ``rlvr train`` and ``rlvr eval`` start
themselves again, once, with the library in ``LD_PRELOAD`` (what PyTorch's own CPU launcher,
``torch.backends.xeon.run_cpu``, does). The children they start (torchrun's processes, reward
workers, a vLLM server) inherit it. Code that builds a ``Trainer`` in its own process keeps the
``malloc`` it started with; ``describe()`` reports the one actually mapped into the process.

No PyPI wheel ships either library; they come from the system: ``libtcmalloc-minimal4`` /
``libjemalloc2`` on Debian and Ubuntu (``make setup`` installs the first where it may).
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

CHOICES = ("auto", "tcmalloc", "jemalloc", "system")
# auto takes the first one found: tcmalloc was the faster of the two (benchmarks/studies/allocator_ab.py)
PREFERENCE = ("tcmalloc", "jemalloc")
LIBRARIES = {
    "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc.so"),
    "jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
}
INSTALL_HINT = {
    "tcmalloc": "apt-get install libtcmalloc-minimal4 (Debian/Ubuntu), "
    "dnf install gperftools-libs (Fedora), conda install -c conda-forge gperftools",
    "jemalloc": "apt-get install libjemalloc2 (Debian/Ubuntu), dnf install jemalloc (Fedora), "
    "conda install -c conda-forge jemalloc",
}
# set in the environment of the process rlvr starts again, so it never loops
REEXEC_MARK = "RLVR_ALLOCATOR_REEXEC"
# tcmalloc prints a line for every allocation above 1 GiB (a large model's weights); silence it
TCMALLOC_QUIET = {"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(1 << 40)}


class AllocatorError(RuntimeError):
    """``train.allocator`` names a library this machine does not have."""


def search_dirs() -> list[Path]:
    """Where the libraries are looked for: this Python's and conda's ``lib``, then the system's."""
    dirs = [Path(sys.prefix) / "lib"]
    if os.environ.get("CONDA_PREFIX"):
        dirs.append(Path(os.environ["CONDA_PREFIX"]) / "lib")
    triplet = f"{platform.machine()}-linux-gnu"
    for root in ("/usr/local/lib", "/usr/lib", "/lib"):
        dirs += [Path(root) / triplet, Path(root)]
    dirs += [Path("/usr/lib64"), Path("/lib64")]
    return dirs


def find_library(kind: str, dirs: list[Path] | None = None) -> Path | None:
    """The first file of ``kind`` (tcmalloc or jemalloc) in ``dirs`` (default ``search_dirs()``)."""
    for d in search_dirs() if dirs is None else dirs:
        for name in LIBRARIES[kind]:
            path = Path(d) / name
            if path.is_file():
                return path
    return None


def resolve(choice: str, dirs: list[Path] | None = None) -> tuple[str, Path | None]:
    """``(kind, library path)`` for a ``train.allocator`` value; ``("system", None)`` for glibc.

    ``auto`` falls back to the system allocator when neither library is found (and on anything
    but Linux, where ``LD_PRELOAD`` does not apply); naming one that is missing is an error.
    """
    if choice not in CHOICES:
        raise AllocatorError(f"train.allocator={choice!r}: choose one of {', '.join(CHOICES)}")
    if choice == "system" or sys.platform != "linux":
        return "system", None
    kinds = PREFERENCE if choice == "auto" else (choice,)
    for kind in kinds:
        path = find_library(kind, dirs)
        if path is not None:
            return kind, path
    if choice == "auto":
        return "system", None
    looked = ", ".join(str(d) for d in (search_dirs() if dirs is None else dirs))
    raise AllocatorError(
        f"train.allocator={choice}: no {' or '.join(LIBRARIES[choice])} in {looked}; "
        f"install it ({INSTALL_HINT[choice]}) or set train.allocator=auto"
    )


def loaded(maps: str | None = None) -> tuple[str, str | None]:
    """The allocator mapped into this process (from ``/proc/self/maps``, or the text ``maps``):
    ``(kind, library path)``, ``("system", None)`` when it is neither tcmalloc nor jemalloc."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return "system", None
    for line in maps.splitlines():
        fields = line.split()
        name = os.path.basename(fields[-1]) if len(fields) >= 6 else ""
        for kind, names in LIBRARIES.items():
            # the mapped file is the one the soname links to (libtcmalloc_minimal.so.4.5.10)
            if any(name == n or name.startswith(n + ".") for n in names):
                return kind, fields[-1]
    return "system", None


def preload_env(path: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` with ``path`` first in ``LD_PRELOAD`` (what was there stays after it)."""
    out = dict(env)
    rest = [p for p in out.get("LD_PRELOAD", "").split(":") if p and p != str(path)]
    out["LD_PRELOAD"] = ":".join([str(path), *rest])
    for key, value in TCMALLOC_QUIET.items():
        out.setdefault(key, value)
    return out


def allocator_env(choice: str, env: dict[str, str]) -> dict[str, str]:
    """``env`` for a child process that should run with ``choice``'s malloc: with the library
    first in ``LD_PRELOAD`` when one is found, else ``env`` as it is (the system malloc)."""
    _, path = resolve(choice)
    return preload_env(path, env) if path is not None else dict(env)


def reexec_with(choice: str) -> None:
    """Start this command again with the allocator ``choice`` resolves to, unless it is already
    mapped (or nothing is to be preloaded). Does not return when it starts again.

    Call only from a process started as a command (``rlvr train``), never inside a library user's
    process: ``os.execve`` replaces the whole process with the same command line.
    """
    kind, path = resolve(choice)
    if kind == "system" or loaded()[0] == kind:
        return
    if os.environ.get(REEXEC_MARK):
        # started again already and still not mapped: ld.so refused it (it printed why)
        print(f"[rlvr] warning: {path} could not be preloaded; using the system malloc", flush=True)
        return
    env = preload_env(path, dict(os.environ))
    env[REEXEC_MARK] = kind
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def describe(choice: str | None = None) -> str:
    """The allocator this process runs with, for a run's first lines and its summary.json."""
    kind, path = loaded()
    text = f"{kind} ({path})" if path else "system malloc"
    if choice is not None:
        text += f", train.allocator={choice}"
        if choice != "system" and kind == "system":
            text += " (none preloaded: in-process use, or no library found)"
    return text
