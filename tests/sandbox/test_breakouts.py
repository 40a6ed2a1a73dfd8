"""Breakouts found by an attacker's review of the sandbox (beyond tests/sandbox/attacks.py): each
test runs the attack for real and checks its effect from outside the sandbox.

- the launcher's status pipe reached the program (it could fake or hide the files/write limit, or
  stall the launcher into a wall-clock timeout);
- bwrap's root, /dev and /dev/shm were writable tmpfs outside the capped working folder (no file
  or byte cap there; without a cgroup not even the memory limit held);
- a trainer killed mid-call (SIGKILL, an OOM kill, a crash) left its programs running past their
  deadline, and the next trainer's sweep did not end them;
- system calls newer than libseccomp's table passed the default-allow filter (``setxattrat``
  wrote the xattrs ``setxattr`` is refused);
- the landlock backend, as uid 0 without capabilities, could chmod (setuid bit included) and
  re-date any root-owned file of the host: Landlock does not cover chmod/utime;
- a plain ``sys.exit(152)`` was reported as the CPU limit (and, under bwrap, a SIGXCPU death).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlvr.sandbox import Limits, get_sandbox
from sandbox.conftest import available

# the boxes are asked for in each test: another test's reset_cache() closes the cached ones
STRONG = [name for name in ("bwrap", "landlock") if available(name) is not None]
needs_bwrap = pytest.mark.skipif("bwrap" not in STRONG, reason="bwrap does not run here")
needs_landlock = pytest.mark.skipif("landlock" not in STRONG, reason="landlock does not run here")
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _run(box, code: str, limits: Limits):
    return box.run(["python3", "main.py"], files={"main.py": code}, limits=limits)


# -- the launcher's status pipe ------------------------------------------------------------

FAKE_STATUS = r"""
import os
made = 0
try:
    for i in range(1000):
        open("f%d" % i, "w").close()
        made += 1
except OSError:
    pass
leaked = []
for name in os.listdir("/proc/self/fd"):
    fd = int(name)
    if fd > 2:
        try:
            os.write(fd, b"1 999 1 999 4096".ljust(256))  # "plenty of inodes and bytes left"
            leaked.append(fd)
        except OSError:
            pass
print("made", made, "wrote to", leaked)
"""

STALL_STATUS = r"""
import os
for name in os.listdir("/proc/self/fd"):
    fd = int(name)
    if fd > 2:
        try:
            os.set_blocking(fd, False)
            while True:
                os.write(fd, b"x" * 4096)
        except OSError:
            pass
print("done")
"""


@needs_bwrap
def test_the_program_cannot_fake_or_stall_the_launchers_status():
    limits = Limits(wall_s=5, cpu_s=5, files=16)
    r = _run(get_sandbox("bwrap"), FAKE_STATUS, limits)
    assert "wrote to []" in r.stdout, r.stdout  # no descriptor of the launcher's reaches it
    assert r.limit == "files", r  # it did use up its inodes
    r = _run(get_sandbox("bwrap"), STALL_STATUS, limits)
    assert (r.returncode, r.timed_out, r.limit, r.stdout) == (0, False, None, "done\n"), r


# -- writes outside the capped working folder ------------------------------------------------

OUTSIDE = r"""
import os
for d in ("/", "/dev", "/root", "/usr", "/box/..", "/proc/.."):
    try:
        open(os.path.join(d, "w"), "w").close()
        print("WROTE", d)
    except OSError:
        pass
made = 0
try:
    for i in range(300):
        open("/dev/shm/f%d" % i, "w").close()
        made += 1
except OSError:
    pass
print("shm files", made)
"""

SHM_BYTES = r"""
import os
for i in range(4):  # 1 MiB files: each under the per-file size limit
    try:
        with open("/dev/shm/big%d" % i, "wb") as f:
            f.write(b"x" * 2**20)
    except OSError:
        pass
print("shm KiB", sum(os.path.getsize("/dev/shm/" + n) for n in os.listdir("/dev/shm")) // 1024)
"""


@needs_bwrap
def test_writes_outside_the_working_folder_count_against_its_caps():
    limits = Limits(wall_s=5, cpu_s=5, files=32, write_bytes=2 * 2**20)
    r = _run(get_sandbox("bwrap"), OUTSIDE, limits)
    assert "WROTE" not in r.stdout, r.stdout  # the root, /dev, /root, /usr are read-only
    made = int(r.stdout.split("shm files")[1])
    assert made < 32, r.stdout  # /dev/shm shares the folder's inode cap (main.py holds one)
    assert r.limit == "files", r
    r = _run(get_sandbox("bwrap"), SHM_BYTES, limits)
    assert int(r.stdout.split("shm KiB")[1]) < 2048, r.stdout  # and its byte cap
    assert r.limit == "write", r


@needs_bwrap
def test_multiprocessing_still_works_under_bwrap():
    code = textwrap.dedent(
        """
        import multiprocessing as mp
        def sq(x):
            return x * x
        if __name__ == "__main__":
            with mp.Pool(2) as pool:
                print(pool.map(sq, range(4)))
            with mp.Lock():  # a POSIX semaphore in /dev/shm
                print("locked")
        """
    )
    r = _run(get_sandbox("bwrap"), code, Limits(wall_s=8, cpu_s=8))
    assert r.stdout.split("\n")[:2] == ["[0, 1, 4, 9]", "locked"], r


# -- a trainer killed mid-call -----------------------------------------------------------------

TRAINER = r"""
import os, sys, threading, time
from rlvr.sandbox import Limits, get_sandbox
box = get_sandbox(sys.argv[1])
threading.Timer(float(sys.argv[3]), lambda: os.kill(os.getpid(), 9)).start()
box.run(["python3", "main.py", sys.argv[2]], files={"main.py": sys.argv[4]},
        limits=Limits(wall_s=30, cpu_s=30))
"""

SLEEPER = "import time; time.sleep(60)"
# a grandchild in its own session: no parent-death signal reaches it
SETSID_SLEEPER = r"""
import os, sys, time
if os.fork() == 0:
    os.setsid()
    os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", sys.argv[1]])
time.sleep(60)
"""


def _marker_pids(marker: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    out.append(int(pid))
            except OSError:
                continue
    return out


def _kill_trainer_mid_call(backend: str, program: str, marker: str) -> None:
    """A trainer process that starts a 60 s program under a 30 s wall limit and is SIGKILLed
    2 s in; returns once it is dead."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", TRAINER, backend, marker, "2.0", program],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]


def _left_after(marker: str, wait_s: float) -> list[int]:
    deadline = time.monotonic() + wait_s
    while (left := _marker_pids(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _kill_marked(marker: str) -> None:
    for pid in _marker_pids(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("backend", STRONG)
def test_a_killed_trainer_leaves_no_program_running(backend):
    marker = f"rlvr-orphan-{os.urandom(4).hex()}"
    try:
        _kill_trainer_mid_call(backend, SLEEPER, marker)
        assert not _left_after(marker, 3.0), "the program outlived its trainer"
    finally:
        _kill_marked(marker)


@needs_landlock
def test_the_next_trainer_ends_what_a_killed_one_left_in_its_cgroups():
    from rlvr.sandbox.cgroup import Cgroups

    if get_sandbox("landlock").inner.cgroups is None:
        pytest.skip("no writable cgroup here")
    marker = f"rlvr-orphan-{os.urandom(4).hex()}"
    try:
        _kill_trainer_mid_call("landlock", SETSID_SLEEPER, marker)
        time.sleep(0.5)
        assert _marker_pids(marker), "the setsid grandchild should still run (no pid namespace)"
        Cgroups.find()  # what a new trainer does first: sweeps the groups of dead ones
        assert not _left_after(marker, 3.0), "the sweep left a dead trainer's program running"
    finally:
        _kill_marked(marker)


# -- system calls the filter does not name ---------------------------------------------------

SETXATTRAT = r"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
class Args(ctypes.Structure):
    _fields_ = [("value", ctypes.c_uint64), ("size", ctypes.c_uint32), ("flags", ctypes.c_uint32)]
open("mine", "w").close()
value = ctypes.create_string_buffer(b"owned")
args = Args(ctypes.addressof(value), 5, 0)
r = libc.syscall(463, -100, b"mine", 0, b"user.rlvr", ctypes.byref(args), ctypes.sizeof(args))
print("setxattrat", r, errno.errorcode.get(ctypes.get_errno()) if r < 0 else "")
print("xattrs", os.listxattr("mine"))
"""


@pytest.mark.parametrize("backend", STRONG)
def test_system_calls_newer_than_the_filter_are_refused(backend):
    if os.uname().release < "6.13":
        pytest.skip("setxattrat (463) arrived in Linux 6.13")
    r = _run(get_sandbox(backend), SETXATTRAT, Limits(wall_s=5, cpu_s=5))
    assert "setxattrat -1 ENOSYS" in r.stdout and "xattrs []" in r.stdout, r


# -- landlock as uid 0 without capabilities ------------------------------------------------------

CHMOD = r"""
import os, sys
for what, fn in (("chmod", lambda p: os.chmod(p, 0o4777)), ("utime", lambda p: os.utime(p, (0, 0)))):
    try:
        fn(sys.argv[1])
        print("CHANGED", what)
    except OSError as exc:
        print("refused", what, exc.errno)
"""


@needs_landlock
def test_landlock_cannot_change_modes_or_times_of_files_outside(tmp_path):
    tmp_path.chmod(0o755)
    planted = tmp_path / "trainer-owned"
    planted.write_text("the trainer's")
    planted.chmod(0o600)
    before = planted.stat()
    r = get_sandbox("landlock").run(
        ["python3", "main.py", str(planted)], files={"main.py": CHMOD}, limits=Limits(wall_s=5)
    )
    after = planted.stat()
    assert stat.S_IMODE(after.st_mode) == 0o600, (oct(after.st_mode), r.stdout)
    assert after.st_mtime == before.st_mtime, r.stdout
    assert "CHANGED" not in r.stdout, r.stdout


# -- exit codes are not limits -------------------------------------------------------------------


@pytest.mark.parametrize("backend", [*STRONG, "unsafe_local"])
def test_an_exit_code_is_not_taken_for_a_limit(backend):
    box = get_sandbox(backend)
    if backend == "bwrap" and box.inner.cgroups is None:
        pytest.skip("without a cgroup bwrap cannot tell exit(152) from SIGXCPU")
    for code in (152, 153):
        r = box.run(["python3", "-c", f"import sys; sys.exit({code})"], limits=Limits(wall_s=5))
        assert (r.returncode, r.limit) == (code, None), r


# -- auto falling back past a stronger backend -------------------------------------------------


@needs_landlock
def test_auto_says_why_it_fell_back_to_a_weaker_backend(tmp_path, monkeypatch, caplog):
    from rlvr.sandbox.bwrap import TOOLS
    from rlvr.sandbox.select import reset_cache

    path = tmp_path / "bin"  # every tool but bwrap
    path.mkdir()
    for tool in [*(t for t in TOOLS if t != "bwrap"), "ldd", "stat", "mkdir", "chown"]:
        found = shutil.which(tool)
        if found:
            (path / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(path))
    reset_cache()
    try:
        with caplog.at_level("WARNING", logger="rlvr.sandbox"):
            assert get_sandbox("auto").name == "landlock"
        said = " ".join(r.getMessage() for r in caplog.records)
        assert "bwrap" in said and "not on PATH: bwrap" in said, said
    finally:
        monkeypatch.undo()
        reset_cache()
