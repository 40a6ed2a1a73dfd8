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

import importlib
import logging
import threading
from collections.abc import Callable

from rlvr.config.sandbox import SANDBOX_BACKENDS
from rlvr.sandbox.base import Sandbox, SandboxUnavailable

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
_default = {"backend": "auto"}


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
            box = _build(backend)
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
            box = _cache.get(name) or _probe_local(name)
            if not isinstance(box, str):
                _cache[name] = box
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


def configure(backend: str) -> None:
    """Set the process default `get_sandbox()` uses (the run's ``sandbox.backend``)."""
    _default["backend"] = backend


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


def describe(backend: str | None = None) -> str:
    """One line for a run's first lines and `rlvr doctor`: the backend in force, or why none."""
    asked = backend or _default["backend"]
    try:
        box = get_sandbox(asked)
    except SandboxUnavailable as exc:
        return f"sandbox: none works ({asked}): {str(exc).splitlines()[1:2]}"
    note = "  (UNSAFE: no isolation)" if box.name == UNSAFE else ""
    return f"sandbox: {box.name} (sandbox.backend={asked}){note}"


def reset_cache() -> None:
    """Forget the probes (tests)."""
    with _lock:
        _cache.clear()
        _failures.clear()
