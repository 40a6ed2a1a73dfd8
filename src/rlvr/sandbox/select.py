"""``sandbox.backend`` -> a working `Sandbox`, probed once per process.

``auto`` takes the strongest backend whose probe passes: ``bwrap`` (namespaces, seccomp, a
cgroup), then ``landlock`` (no namespaces: Landlock, seccomp, an unprivileged uid, rlimits, a
cgroup). A probe is a real run of a tiny program that checks the isolation holds (it cannot see
the trainer's files or environment, reach the network, or write outside its folder), not a
look for the binary. ``unsafe_local`` is never chosen by ``auto``: only by name, loudly warned.
A name ``package.module:Factory`` is any other backend (a remote service: docs/sandbox.md),
built by calling the factory with no arguments; it must have ``name`` and ``run``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence

from rlvr.config.sandbox import SANDBOX_BACKENDS, SandboxConfig
from rlvr.sandbox.base import Limits, Result, Sandbox, SandboxUnavailable

log = logging.getLogger("rlvr.sandbox")

# strongest first; each entry: name -> "module:Class" with a ``probe() -> str | None`` classmethod
LOCAL_BACKENDS = {
    "bwrap": "rlvr.sandbox.bwrap:BwrapSandbox",
    "landlock": "rlvr.sandbox.landlock:LandlockSandbox",
}
UNSAFE = "unsafe_local"
BACKENDS = SANDBOX_BACKENDS

UNSAFE_WARNING = (
    "sandbox.backend=unsafe_local: model-written code runs as the trainer's user with NO "
    "isolation (it can read your files, tokens and environment, use the network, signal and "
    "write into the trainer). Use it only for code you trust or on a throwaway machine."
)

_lock = threading.Lock()
_cache: dict[str, Sandbox] = {}
_failures: dict[str, str] = {}
_default: dict = {"backend": "auto", "concurrency": 0, "limits": Limits()}
_slots: dict[str, threading.BoundedSemaphore] = {}


def concurrency() -> int:
    """How many sandboxed programs run at once in this process: ``sandbox.concurrency``, or
    (0) as many as half the available memory holds at the default memory limit, at least the
    number of CPU cores and at most 64. Sized to memory, not cores: a call mostly waits on its
    own wall-clock limit, and one waiting for a slot makes its episode late."""
    if _default["concurrency"]:
        return _default["concurrency"]
    cores = os.cpu_count() or 1
    try:
        import psutil

        by_memory = psutil.virtual_memory().available // 2 // (_default["limits"].memory_mb * 2**20)
    except Exception:  # noqa: BLE001 - no psutil or no /proc: cores only
        by_memory = cores
    return int(max(cores, min(64, by_memory)))


def _slot() -> threading.BoundedSemaphore:
    with _lock:
        if "sem" not in _slots:
            _slots["sem"] = threading.BoundedSemaphore(concurrency())
        return _slots["sem"]


class Bounded:
    """A backend behind the process's semaphore: a call waits for a slot first, and its limits
    (wall time included) start only once its program does."""

    def __init__(self, inner: Sandbox) -> None:
        self.inner, self.name = inner, inner.name

    def run(
        self,
        argv: Sequence[str],
        *,
        files: Mapping[str, str | bytes] = {},  # noqa: B006 - read only
        stdin: str | bytes = b"",
        limits: Limits | None = None,
    ) -> Result:
        with _slot():
            return self.inner.run(
                argv, files=files, stdin=stdin, limits=limits or _default["limits"]
            )


def _load(target: str) -> Callable[[], Sandbox]:
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _probe_local(name: str) -> Sandbox | str:
    """A ready backend, or why it cannot run here."""
    try:
        cls = _load(LOCAL_BACKENDS[name])
        why = cls.probe()
    except Exception as exc:  # noqa: BLE001 - any failure means this backend does not run here
        return f"{type(exc).__name__}: {exc}"
    return cls() if why is None else why


def _unavailable(tried: dict[str, str], asked: str) -> SandboxUnavailable:
    lines = "\n".join(f"  - {name}: {why}" for name, why in tried.items())
    return SandboxUnavailable(
        f"sandbox.backend={asked}: no sandbox works on this machine:\n{lines}\n"
        "To fix: install bubblewrap and libseccomp (`make setup` does, as root; or "
        "`apt-get install bubblewrap libseccomp2`) and allow unprivileged user namespaces "
        "(sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0), or run on a "
        "kernel with Landlock (5.13+). docs/sandbox.md says what each backend needs. "
        "sandbox.backend=unsafe_local runs the code with no isolation at all: it exists, and it "
        "is unsafe."
    )


def get_sandbox(backend: str | None = None) -> Sandbox:
    """The sandbox ``backend`` names (None: the process default, `configure`), probed once per
    process and cached; SandboxUnavailable when it (for ``auto``: every local backend) fails."""
    backend = backend or _default["backend"]
    with _lock:
        if backend in _cache:
            return _cache[backend]
        if backend in _failures:
            raise SandboxUnavailable(_failures[backend])
        try:
            box = Bounded(_build(backend))
        except SandboxUnavailable as exc:
            _failures[backend] = str(exc)
            raise
        _cache[backend] = box
        return box


def _build(backend: str) -> Sandbox:
    if backend == UNSAFE:
        from rlvr.sandbox.unsafe_local import UnsafeLocalSandbox

        log.warning(UNSAFE_WARNING)
        return UnsafeLocalSandbox()
    if backend == "auto" or backend in LOCAL_BACKENDS:
        tried = {}
        for name in LOCAL_BACKENDS if backend == "auto" else (backend,):
            box = _cache[name].inner if name in _cache else _probe_local(name)
            if not isinstance(box, str):
                _cache[name] = Bounded(box)
                return box
            tried[name] = box
        raise _unavailable(tried, backend)
    if ":" not in backend:
        raise SandboxUnavailable(
            f"sandbox.backend={backend!r}: not one of {', '.join(BACKENDS)} nor "
            "'package.module:Factory' (a remote backend: docs/sandbox.md)"
        )
    try:
        box = _load(backend)()
    except Exception as exc:  # noqa: BLE001 - the user's factory: report what it raised
        raise SandboxUnavailable(
            f"sandbox.backend={backend!r}: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(box, Sandbox):
        raise SandboxUnavailable(
            f"sandbox.backend={backend!r}: the factory's result has no name/run"
        )
    return box


def configure(section: SandboxConfig) -> None:
    """The run's ``sandbox`` section as this process's defaults: the backend `get_sandbox()`
    returns, the limits of a call that gives none, the number of programs at once."""
    limits = Limits(
        wall_s=section.wall_s,
        cpu_s=section.cpu_s,
        memory_mb=section.memory_mb,
        processes=section.processes,
        write_bytes=section.write_bytes,
        files=section.files,
        output_bytes=section.output_bytes,
    )
    with _lock:
        _default.update(backend=section.backend, concurrency=section.concurrency, limits=limits)
        _slots.clear()  # the next call sizes the semaphore anew


def default_limits(**changes: float) -> Limits:
    """The process's default limits (``sandbox.*``) with ``changes`` applied."""
    return dataclasses.replace(_default["limits"], **changes)


def require_sandbox(what: str, backend: str | None = None) -> Sandbox:
    """The sandbox for ``what`` (``env.name=python``, the ``code`` reward), or
    SandboxUnavailable whose message names it: the check the entry points call before they run
    any model-written code."""
    try:
        return get_sandbox(backend)
    except SandboxUnavailable as exc:
        raise SandboxUnavailable(
            f"{what} runs model-written code and needs a sandbox. {exc}"
        ) from exc


def sandbox_problem(what: str, backend: str | None = None) -> str | None:
    """None when a sandbox for ``what`` works here, else the reason (a config check's line)."""
    try:
        require_sandbox(what, backend)
    except SandboxUnavailable as exc:
        return str(exc)
    return None


def in_use() -> str | None:
    """`describe()` of the backend this process already built (None: nothing asked for one)."""
    with _lock:
        built = dict(_cache)
    box = built.get(_default["backend"]) or next(iter(built.values()), None)
    if box is None:
        return None
    note = "  (UNSAFE: no isolation)" if box.name == UNSAFE else ""
    return f"{box.name} (sandbox.backend={_default['backend']}){note}"


def describe(backend: str | None = None) -> str:
    """One line for a run's first lines and `rlvr doctor`: the backend in force, or why none."""
    asked = backend or _default["backend"]
    try:
        box = get_sandbox(asked)
    except SandboxUnavailable as exc:
        first = str(exc).splitlines()[1:2]
        return f"sandbox: none works (sandbox.backend={asked}){': ' + first[0].strip() if first else ''}"
    note = "  (UNSAFE: no isolation)" if box.name == UNSAFE else ""
    return f"sandbox: {box.name} (sandbox.backend={asked}){note}"


def reset_cache() -> None:
    """Forget the probes (tests)."""
    with _lock:
        for box in _cache.values():
            with contextlib.suppress(Exception):
                getattr(box.inner, "close", lambda: None)()
        _cache.clear()
        _failures.clear()
        _slots.clear()
