"""``sandbox.backend=landlock``: the fallback where bubblewrap cannot run (no user namespaces:
a container's default seccomp profile, a distribution that turns them off), with no namespace
at all (docs/sandbox.md says what that leaves open).

One call, as launched:

    sh -c 'join the call's cgroups; exec "$@"'               (where a cgroup is writable)
    setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all --no-new-privs   (as root)
    prlimit --cpu --fsize --core=0 [--as --nproc without a cgroup]
    python3 -E -s -S -c LAUNCHER ...                           (the sandbox's own interpreter)
      LAUNCHER: Landlock (read-only: the interpreter's files; read-write: the call's folder;
      no TCP; ABI 6+: no abstract unix sockets, no signals out of the domain), then the seccomp
      filter (no socket() at all, the deny list of rlvr.sandbox.seccomp), then exec the program.

The working folder is a fresh host folder owned by the program's uid. Limits: memory summed over
the tree and a process count in a cgroup where writable (else per process: address space, and a
process count for the uid); CPU per process (and summed, with a cgroup); file size per file;
the number of files and the bytes written are counted after the call (flagged, not stopped); at
the deadline the session's processes and the cgroup's are killed.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence

from rlvr.sandbox.base import Limits, Result, check_files, process_folder
from rlvr.sandbox.cgroup import CallGroup, Cgroups
from rlvr.sandbox.interpreter import executable, reachable_by_others, resolve_argv, system_files
from rlvr.sandbox.process import decode, run_process
from rlvr.sandbox.seccomp import bpf
from rlvr.sandbox.unsafe_local import count_files, limit_from_exit, prlimit_argv, program_env

NOBODY = 65534
TOOLS = ("setpriv", "prlimit", "sh")

# Runs in the sandbox's interpreter (-E -s -S: the standard library only) before the program:
# argv = [seccomp fd, folder, json of read-only paths, program argv...]
LAUNCHER = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def check(r, what):
    if r < 0:
        e = ctypes.get_errno()
        sys.stderr.write("rlvr sandbox: %s failed: %s\n" % (what, os.strerror(e)))
        os._exit(126)
    return r
fd, folder, ro = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
argv = sys.argv[4:]
abi = libc.syscall(444, None, 0, 1)
if abi < 1:
    sys.stderr.write("rlvr sandbox: no Landlock in this kernel\n"); os._exit(126)
fs_all = (1 << 13) - 1 | (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0) | (1 << 15 if abi >= 5 else 0)
file_rights = 1 | 2 | 4 | (1 << 14 if abi >= 3 else 0) | (1 << 15 if abi >= 5 else 0)
net = 3 if abi >= 4 else 0
scoped = 3 if abi >= 6 else 0
class Ruleset(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]
class Beneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("fd", ctypes.c_int32)]
attr = Ruleset(fs_all, net, scoped)
size = 24 if abi >= 6 else 16 if abi >= 4 else 8
rs = check(libc.syscall(444, ctypes.byref(attr), size, 0), "landlock_create_ruleset")
def allow(path, rights):
    try:
        pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    if not os.path.isdir(path):
        rights &= file_rights
    rule = Beneath(rights, pfd)
    check(libc.syscall(445, rs, 1, ctypes.byref(rule), 0), "landlock_add_rule " + path)
    os.close(pfd)
READ = 1 | 4 | 8  # execute, read file, read dir
for p in ro:
    allow(p, READ)
allow("/dev/null", 2 | 4)
allow("/dev/urandom", 4)
allow(folder, fs_all & ~1)  # everything but execute
check(libc.prctl(38, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
check(libc.syscall(446, rs, 0), "landlock_restrict_self")
os.close(rs)
prog = os.read(fd, 1 << 20)
os.close(fd)
class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
fprog = SockFprog(len(prog) // 8, prog)
check(libc.prctl(22, 2, ctypes.byref(fprog), 0, 0), "PR_SET_SECCOMP")
os.chdir(folder)
os.execve(argv[0], argv, {ENV})
"""


class LandlockSandbox:
    name = "landlock"

    def __init__(self) -> None:
        missing = [t for t in TOOLS if shutil.which(t) is None]
        if missing:
            raise RuntimeError(f"not on PATH: {', '.join(missing)}")
        self.tools = {t: shutil.which(t) for t in TOOLS}
        self.root = os.geteuid() == 0
        s = system_files()
        self.read_only = [*s.read_dirs, *s.read_files, *(p for _, p in s.symlinks)]
        # as root: the program runs as uid 65534 where that uid can reach the interpreter; else
        # (an interpreter under /root) as uid 0 with no capabilities left (docs/sandbox.md)
        self.drop_uid = self.root and all(
            reachable_by_others(p if os.path.isfile(p) else p + "/.")
            for p in [*s.read_dirs, *s.read_files]
        )
        # a uid that owns host files (0 without capabilities, or the user's own) could chmod or
        # re-date any of them: Landlock does not cover chmod/chown/utime
        self.seccomp = bpf(allow_inet=False, allow_unix=False, deny_owner_calls=not self.drop_uid)
        self.cgroups = Cgroups.find()
        self.home = process_folder("landlock")
        atexit.register(shutil.rmtree, self.home, True)
        os.chmod(self.home, 0o711)
        self._lock = threading.Lock()

    def close(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)

    def __del__(self) -> None:
        # at interpreter exit module globals (contextlib, shutil) may already be None
        try:  # noqa: SIM105
            self.close()
        except Exception:
            pass

    @classmethod
    def probe(cls) -> str | None:
        import ctypes

        from rlvr.sandbox.probe import check_isolation

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        abi = libc.syscall(444, None, 0, 1)
        if abi < 1:
            return f"no Landlock in this kernel ({os.strerror(ctypes.get_errno())}; needs 5.13+)"
        try:
            box = cls()
        except (OSError, RuntimeError, ImportError) as exc:
            return f"{type(exc).__name__}: {exc}"
        why = check_isolation(box)
        if why is not None:
            box.close()
        return why

    def command(
        self, argv: Sequence[str], folder: str, fd: int, limits: Limits, group: CallGroup | None
    ) -> list[str]:
        t = self.tools
        lines = [f"echo $$ > {p} || exit 125" for p in (group.join if group else [])]
        lines.append('exec "$@"')
        # the program dies with the trainer (setpriv sets the signal after changing the uid,
        # which would clear it); a child it puts in a session of its own is left to the cgroup's
        # sweep by the next trainer (rlvr.sandbox.cgroup)
        drop = [t["setpriv"], "--pdeathsig=KILL", "--"]
        if self.root and not self.drop_uid:
            drop = [
                t["setpriv"],
                "--pdeathsig=KILL",
                "--inh-caps=-all",
                "--ambient-caps=-all",
                "--bounding-set=-all",
                "--securebits=+noroot,+noroot_locked,+no_setuid_fixup,+no_setuid_fixup_locked",
                "--no-new-privs",
                "--",
            ]
        elif self.root:
            drop = [
                t["setpriv"],
                "--pdeathsig=KILL",
                f"--reuid={NOBODY}",
                f"--regid={NOBODY}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
                "--",
            ]
        rl = prlimit_argv(limits, processes=group is None)
        if group is not None:
            rl = [a for a in rl if not a.startswith("--as=")]
        rl[0] = t["prlimit"]
        launcher = LAUNCHER.replace("{ENV}", repr(program_env(folder)))
        program = resolve_argv(argv)
        return [
            t["sh"],
            "-c",
            "\n".join(lines),
            "rlvr-sandbox",
            *drop,
            *rl,
            executable(),
            "-E",
            "-s",
            "-S",
            "-c",
            launcher,
            str(fd),
            folder,
            json.dumps(self.read_only),
            *program,
        ]

    def run(
        self,
        argv: Sequence[str],
        *,
        files: Mapping[str, str | bytes] = {},  # noqa: B006 - read only
        stdin: str | bytes = b"",
        limits: Limits = Limits(),  # noqa: B008 - frozen
    ) -> Result:
        contents = check_files(files)
        folder = tempfile.mkdtemp(dir=self.home)
        group = None
        fd = os.memfd_create("rlvr-seccomp")
        try:
            os.write(fd, self.seccomp)
            os.lseek(fd, 0, os.SEEK_SET)
            for name, data in contents.items():
                path = os.path.join(folder, name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(data)
            if self.drop_uid:
                for root, dirs, names in os.walk(folder):
                    for n in [root, *(os.path.join(root, x) for x in dirs + names)]:
                        os.chown(n, NOBODY, NOBODY)
            os.chmod(folder, 0o700)
            given = count_files(folder)[0]
            if self.cgroups is not None:
                group = self.cgroups.new_call(limits.memory_mb * 2**20, limits.processes + 1)
            cpu_s = limits.cpu_s

            def watch() -> str | None:
                used = group.cpu_s() if group is not None else None
                return "cpu" if used is not None and used > cpu_s else None

            def kill(proc: subprocess.Popen) -> None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                if group is not None:
                    group.kill_all()

            raw = run_process(
                self.command(argv, folder, fd, limits, group),
                stdin=stdin.encode() if isinstance(stdin, str) else bytes(stdin),
                wall_s=limits.wall_s,
                output_bytes=limits.output_bytes,
                pass_fds=[fd],
                kill=kill,
                watch=watch,
                after_exit=group.kill_all if group is not None else None,
            )
            n, size = count_files(folder)
            limit = "wall" if raw.timed_out else raw.stopped
            if limit is None and group is not None and group.oom_killed():
                limit = "memory"
            if limit is None:
                cpu = group.cpu_s() if group is not None else None
                limit = limit_from_exit(raw.returncode, limits, cpu)
            if limit is None and group is not None and group.pids_hit():
                limit = "processes"
            if limit is None and n - given > limits.files:
                limit = "files"
            if limit is None and size > limits.write_bytes:
                limit = "write"
            if limit is None and raw.output_cut:
                limit = "output"
        finally:
            os.close(fd)
            if group is not None:
                group.kill_all()
                group.remove()
            shutil.rmtree(folder, ignore_errors=True)
        return Result(
            raw.returncode,
            decode(raw.stdout),
            decode(raw.stderr),
            raw.timed_out,
            limit,
            raw.wall_s,
            self.name,
        )
