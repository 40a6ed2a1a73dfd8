"""A child Python process that runs functions by name under a hard time limit.

Threads cannot be stopped and signal-based timeouts only work in the main thread, so
anything that may hang (sympy on a hostile answer, a user's reward function) runs in a
separate process that is killed and replaced when it overruns. The process:

- is started with ``subprocess`` (``python -c ...``), not ``multiprocessing``: it never
  re-imports the trainer's ``__main__`` and never inherits its threads or CUDA state;
- gets the parent's ``sys.path`` through ``PYTHONPATH``, so any ``package.module:function``
  the parent can import, the child can import;
- imports ``preload`` modules before it reports ready, so a call's time limit never pays
  for import time (start-up has its own, longer limit);
- dies with its parent (``PR_SET_PDEATHSIG`` on Linux, plus a watchdog thread) and can
  have its address space capped (``memory_limit_mb``), so a runaway computation fails
  with MemoryError instead of swapping the machine;
- ignores Ctrl-C, which the parent handles by closing it.

Messages are pickled over two pipes (``multiprocessing.connection.Connection``):
parent -> child ``("call", call_id, "module:function", args, kwargs)``;
child -> parent ``("ready", pid)``, ``("ok", call_id, value)`` or
``("err", call_id, type_name, message, traceback_text)``.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import itertools
import os
import subprocess
import sys
import time
import traceback
import weakref
from multiprocessing.connection import Connection
from typing import Any

__all__ = [
    "SandboxError",
    "SandboxTimeout",
    "SandboxWorker",
    "WorkerDied",
    "resolve_target",
]

_LIVE_WORKERS: weakref.WeakSet[SandboxWorker] = weakref.WeakSet()


class SandboxError(RuntimeError):
    """The called function raised in the child; ``remote_traceback`` is its traceback."""

    def __init__(self, message: str, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback


class SandboxTimeout(TimeoutError):
    """The call did not finish within its time limit; the child was killed."""


class WorkerDied(RuntimeError):
    """The child process exited (crash, out of memory, killed) or never started."""


def resolve_target(target: str) -> Any:
    """Import ``"package.module:function"`` (attribute paths like ``mod:Class.method`` allowed)."""
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        raise ValueError(f"target {target!r} is not of the form 'package.module:function'")
    obj: Any = importlib.import_module(module_name)
    for attr in attr_path.split("."):
        obj = getattr(obj, attr)
    return obj


class SandboxWorker:
    """One child process; at most one call in flight.

    ``call`` is the blocking interface. ``start``/``submit``/``read``/``connection`` are the
    non-blocking pieces a scheduler (``pool.SandboxPool``) uses to drive several workers.
    """

    def __init__(
        self,
        *,
        preload: tuple[str, ...] = (),
        memory_limit_mb: int | None = None,
        startup_timeout_s: float = 60.0,
    ) -> None:
        if memory_limit_mb is not None and memory_limit_mb <= 0:
            raise ValueError(f"memory_limit_mb must be positive, got {memory_limit_mb}")
        self.preload = tuple(preload)
        self.memory_limit_mb = memory_limit_mb
        self.startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._recv: Connection | None = None
        self._send: Connection | None = None
        self._ids = itertools.count()
        self.ready = False
        self.busy_call: int | None = None
        self.startup_deadline = 0.0
        self.restarts = 0
        _LIVE_WORKERS.add(self)

    # -- life cycle -------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Launch the child if it is not running; returns at once (see ``wait_ready``)."""
        if self.alive:
            return
        self.kill()
        parent_read, child_write = os.pipe()
        child_read, parent_write = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        code = "from rlvr.rewards.sandbox import _child_main; _child_main()"
        args = [str(child_read), str(child_write), str(os.getpid()), str(self.memory_limit_mb or 0)]
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", code, *args, *self.preload],
                pass_fds=(child_read, child_write),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        except BaseException:
            os.close(parent_read)
            os.close(parent_write)
            raise
        finally:
            os.close(child_read)
            os.close(child_write)
        self._recv = Connection(parent_read, writable=False)
        self._send = Connection(parent_write, readable=False)
        self.ready = False
        self.busy_call = None
        self.startup_deadline = time.monotonic() + self.startup_timeout_s

    def kill(self) -> None:
        """Kill the child (if any) and close the pipes; ``start`` makes a fresh one."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
        for conn in (self._recv, self._send):
            if conn is not None:
                conn.close()
        self._proc = self._recv = self._send = None
        self.ready = False
        self.busy_call = None

    def restart(self) -> None:
        self.kill()
        self.restarts += 1
        self.start()

    close = kill

    def __del__(self) -> None:
        # at interpreter exit module globals (contextlib, shutil) may already be None
        try:  # noqa: SIM105
            self.kill()
        except Exception:
            pass

    # -- non-blocking pieces ----------------------------------------------------------

    @property
    def connection(self) -> Connection:
        """The readable end, for ``multiprocessing.connection.wait``."""
        if self._recv is None:
            raise WorkerDied("worker is not running")
        return self._recv

    def submit(self, target: str, args: tuple = (), kwargs: dict | None = None) -> int:
        """Send one call to a ready, idle worker; returns its call id."""
        if not self.ready or self.busy_call is not None or self._send is None:
            raise RuntimeError("submit() needs a ready, idle worker")
        call_id = next(self._ids)
        try:
            self._send.send(("call", call_id, target, tuple(args), dict(kwargs or {})))
        except (BrokenPipeError, OSError) as exc:
            raise WorkerDied(f"worker exited before the call was sent ({exc})") from exc
        self.busy_call = call_id
        return call_id

    def read(self) -> tuple:
        """Read one message (after ``connection`` polled readable); updates ready/busy state."""
        try:
            msg = self.connection.recv()
        except (EOFError, OSError) as exc:
            code = None
            if self._proc is not None:
                # The pipe closes a moment before the process is reapable; wait for its code.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = self._proc.wait(timeout=1.0)
            raise WorkerDied(f"worker process exited (exit code {code})") from exc
        if msg[0] == "ready":
            self.ready = True
        elif msg[0] in ("ok", "err"):
            self.busy_call = None
        return msg

    # -- blocking interface -----------------------------------------------------------

    def wait_ready(self) -> None:
        """Start if needed and block until the child has imported its preload modules."""
        self.start()
        while not self.ready:
            remaining = self.startup_deadline - time.monotonic()
            if remaining <= 0 or not self.connection.poll(remaining):
                self.kill()
                raise WorkerDied(f"worker did not start within {self.startup_timeout_s} s")
            self.read()

    def call(
        self, target: str, args: tuple = (), kwargs: dict | None = None, *, timeout_s: float
    ) -> Any:
        """Run ``target(*args, **kwargs)`` in the child; the time limit starts once it is ready.

        Raises SandboxTimeout (child killed and restarted), WorkerDied (child crashed;
        restarted) or SandboxError (the function raised; child kept).
        """
        try:
            self.wait_ready()
            call_id = self.submit(target, args, kwargs)
            if not self.connection.poll(timeout_s):
                self.restart()
                raise SandboxTimeout(f"{target} did not finish within {timeout_s} s")
            msg = self.read()
        except WorkerDied:
            self.restart()
            raise
        if msg[1] != call_id:  # pragma: no cover - protocol invariant
            raise RuntimeError(f"reply for call {msg[1]}, expected {call_id}")
        if msg[0] == "ok":
            return msg[2]
        _, _, type_name, message, tb = msg
        raise SandboxError(f"{type_name}: {message}", tb)


@atexit.register
def _kill_all_workers() -> None:
    for worker in list(_LIVE_WORKERS):
        worker.kill()


# -- child side ---------------------------------------------------------------------------


def _die_with_parent(parent_pid: int) -> None:
    """Exit when the parent exits, even if the main thread is stuck in C code."""
    import signal
    import threading

    if sys.platform.startswith("linux"):
        try:
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
        except (OSError, AttributeError):  # pragma: no cover - exotic libc
            pass

    def watchdog() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=watchdog, daemon=True).start()
    # Ctrl-C and a cluster's stop signals reach the whole process group; the parent closes its
    # workers when it stops (and PR_SET_PDEATHSIG ends them if it dies), so they wait for it.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


def _child_main() -> None:
    """Entry point of the child: ``argv = [read_fd, write_fd, parent_pid, mem_mb, *preload]``."""
    read_fd, write_fd, parent_pid, memory_mb = (int(a) for a in sys.argv[1:5])
    _die_with_parent(parent_pid)
    if memory_mb:
        import resource

        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    inbox = Connection(read_fd, writable=False)
    outbox = Connection(write_fd, readable=False)
    for module in sys.argv[5:]:
        importlib.import_module(module)
    outbox.send(("ready", os.getpid()))
    targets: dict[str, Any] = {}
    while True:
        try:
            msg = inbox.recv()
        except (EOFError, OSError):
            return
        _, call_id, target, args, kwargs = msg
        try:
            if target not in targets:
                targets[target] = resolve_target(target)
            outbox.send(("ok", call_id, targets[target](*args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 - everything is reported to the parent
            detail = traceback.format_exc()
            try:
                message = str(exc)[:2000]
            except Exception:  # noqa: BLE001 - str() of a hostile object
                message = "<unprintable>"
            outbox.send(("err", call_id, type(exc).__name__, message, detail))
