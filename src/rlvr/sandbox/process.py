"""Run one launcher command under a wall-clock deadline, its output read through pipes.

Every backend ends in `run_process`: the program's stdin, stdout and stderr are pipes the
trainer holds (a program can write nothing the trainer reads back but these two streams), each
stream is cut at ``output_bytes`` (then its pipe is closed: a program that keeps printing gets
EPIPE instead of the trainer's CPU), and at the deadline ``kill`` ends the whole process tree.
No ``preexec_fn``: the Python tool calls this from many threads at once, and forking a threaded
process to run Python code in the child can deadlock; limits are applied by the launcher
command instead (``prlimit``, ``setpriv``, a cgroup joined by a shell before it execs).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass
class Raw:
    returncode: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool
    output_cut: bool
    wall_s: float
    stopped: str | None = None  # a limit the watcher stopped the program for ("cpu")


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_process(
    cmd: Sequence[str],
    *,
    stdin: bytes,
    wall_s: float,
    output_bytes: int,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    pass_fds: Sequence[int] = (),
    kill: Callable[[subprocess.Popen], None] = _kill_group,
    watch: Callable[[], str | None] | None = None,
    after_exit: Callable[[], None] | None = None,
) -> Raw:
    """Run ``cmd`` (in a new session) until it exits or ``wall_s`` passes; ``watch`` is polled
    every 50 ms and may name a limit to stop the program for (then ``kill``). ``after_exit``
    runs once the launcher has exited, before the pipes are drained (a backend whose program
    tree can outlive the launcher ends it there)."""
    start = time.monotonic()
    deadline = start + wall_s
    proc = subprocess.Popen(
        list(cmd),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env if env is not None else {},
        pass_fds=tuple(pass_fds),
        start_new_session=True,
        close_fds=True,
    )
    out_fd, err_fd, in_fd = proc.stdout.fileno(), proc.stderr.fileno(), proc.stdin.fileno()
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    streams = {out_fd: proc.stdout, err_fd: proc.stderr}
    cut = False
    timed_out = False
    stopped = None
    sel = selectors.DefaultSelector()
    try:
        for stream in (proc.stdout, proc.stderr):
            os.set_blocking(stream.fileno(), False)
            sel.register(stream.fileno(), selectors.EVENT_READ)
        pending = memoryview(stdin)
        if pending:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        exited_at = None
        while sel.get_map():
            now = time.monotonic()
            if proc.poll() is not None and exited_at is None:
                exited_at = now
                if after_exit is not None:
                    after_exit()
            if exited_at is not None and now - exited_at > 0.5:
                break  # the launcher is gone; what still holds a pipe is not its program's
            if now >= deadline:
                timed_out = True
                kill(proc)
                break
            if watch is not None and exited_at is None:
                stopped = watch()
                if stopped is not None:
                    kill(proc)
                    break
            for key, _ in sel.select(min(0.05, max(0.0, deadline - now))):
                fd = key.fd
                if fd == in_fd:
                    try:
                        n = os.write(fd, pending[:65536])
                        pending = pending[n:]
                    except (BrokenPipeError, BlockingIOError) as exc:
                        n = -1 if isinstance(exc, BrokenPipeError) else 0
                    if n < 0 or not pending:
                        sel.unregister(fd)
                        proc.stdin.close()
                    continue
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    continue
                buf = bufs[fd]
                room = output_bytes - len(buf)
                buf += chunk[: max(0, room)]
                if len(chunk) > room:
                    cut = True
                    sel.unregister(fd)
                    streams[fd].close()  # the writer gets EPIPE from now on
        try:
            returncode = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            kill(proc)
            returncode = proc.wait()
        if after_exit is not None and exited_at is None:
            after_exit()
    except BaseException:
        kill(proc)
        proc.wait()
        raise
    finally:
        sel.close()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            with contextlib.suppress(OSError):
                stream.close()
    if timed_out or stopped:
        returncode = None
    return Raw(
        returncode,
        bytes(bufs[out_fd]),
        bytes(bufs[err_fd]),
        timed_out,
        cut,
        time.monotonic() - start,
        stopped,
    )


def decode(data: bytes) -> str:
    return data.decode("utf-8", "replace")
