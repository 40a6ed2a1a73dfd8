"""``sandbox.backend=bwrap``: bubblewrap with every namespace, seccomp, an unprivileged uid and
a cgroup per call (docs/sandbox.md).

One call, as launched (as root; the non-root chain is below):

    unshare --mount --propagation private -- sh -c SCRIPT     (a private mount namespace)
      SCRIPT: join the call's cgroups (memory, pids, cpuacct); mount the working folder, a tmpfs
      capped in bytes (write_bytes) and inodes (files); bind the interpreter's folders that
      uid 65534 cannot reach (/root/.pyenv...) under a staging folder, read-only; then
    exec setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all --no-new-privs
    prlimit --cpu --core=0 [--as --nproc without a cgroup]
    bwrap --unshare-all --disable-userns --die-with-parent --new-session --uid 65534 ...
          --clearenv --seccomp FD --ro-bind <what python3 needs> --bind <tmpfs> /box
          --proc /proc --dev /dev --chdir /box  python3 -E -s -S ...

so the program runs as uid 65534 also outside its namespaces (an escape lands as nobody), sees
only the interpreter, the shared libraries and its folder, has no network (an empty network
namespace), no other process (its own pid namespace and /proc), none of the trainer's
environment, and the whole tree dies with bwrap's pid-1 when the trainer kills bwrap at the
deadline (``--die-with-parent``), and again by the cgroup's process list.

Without root (a user's own machine with unprivileged user namespaces): ``unshare --user
--map-root-user --mount`` makes the mount namespace the tmpfs needs, bwrap runs as the user,
and a cgroup is used only where the user may write one (else rlimits: address space per
process and a process count for the user).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence

from rlvr.sandbox.base import Limits, Result, check_files, process_folder
from rlvr.sandbox.cgroup import CallGroup, Cgroups
from rlvr.sandbox.interpreter import (
    SystemFiles,
    reachable_by_others,
    resolve_argv,
    system_files,
    traversable_by_others,
)
from rlvr.sandbox.process import decode, run_process
from rlvr.sandbox.seccomp import bpf
from rlvr.sandbox.unsafe_local import limit_from_exit, prlimit_argv, program_env

BOX = "/box"  # the working folder inside
NOBODY = 65534
TOOLS = ("bwrap", "unshare", "setpriv", "prlimit", "mount", "sh")
_calls = itertools.count()  # names each call's status file


def _temp_for_nobody() -> str:
    """Where the backend's folder goes as root: bwrap, started as uid 65534, opens its working
    folder and the staged interpreter folders by path, so every folder above them must be
    passable by that uid. TMPDIR when it is; a private one (0700: a job's own) gives way to
    the system's. The program's files live on the per-call tmpfs, not on that disk."""
    for folder in (tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(folder) and traversable_by_others(folder):
            return folder
    raise RuntimeError(
        f"no temporary folder uid {NOBODY} can pass into ({tempfile.gettempdir()}, /tmp, "
        "/var/tmp, /dev/shm): as root the program runs as that uid; set TMPDIR to a folder "
        "every user may traverse (o+x)"
    )


class BwrapSandbox:
    name = "bwrap"

    def __init__(self) -> None:
        missing = [t for t in TOOLS if shutil.which(t) is None]
        if missing:
            raise RuntimeError(f"not on PATH: {', '.join(missing)}")
        self.tools = {t: shutil.which(t) for t in TOOLS}
        self.root = os.geteuid() == 0
        self.sys: SystemFiles = system_files()
        self.seccomp = bpf(allow_inet=True)  # the network namespace is empty
        self.cgroups = Cgroups.find()
        self.home = process_folder("sandbox", _temp_for_nobody() if self.root else None)
        atexit.register(shutil.rmtree, self.home, True)
        os.chmod(self.home, 0o755)
        self.mnt = os.path.join(self.home, "box")
        os.mkdir(self.mnt)
        self.stage = os.path.join(self.home, "ro")
        os.mkdir(self.stage)
        self._lock = threading.Lock()
        self._staged: list[tuple[str, str]] = []  # (host path, staging path)
        self._fixed = self._fixed_args()

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
        from rlvr.sandbox.probe import check_isolation

        try:
            box = cls()
        except (OSError, RuntimeError, ImportError) as exc:
            return f"{type(exc).__name__}: {exc}"
        why = check_isolation(box)
        if why is not None:
            box.close()
        return why

    # -- the command line --------------------------------------------------------------

    def _source(self, path: str, is_dir: bool) -> str:
        """Where bwrap reads ``path`` from: itself, or (as root, where nobody cannot reach it)
        a read-only bind under the staging folder that the launcher shell makes."""
        if not self.root or reachable_by_others(path if not is_dir else path + "/."):
            return path
        staged = os.path.join(self.stage, str(len(self._staged)))
        if is_dir:
            os.mkdir(staged)
        else:
            open(staged, "w").close()
        os.chmod(staged, 0o755)
        self._staged.append((path, staged))
        return staged

    def _fixed_args(self) -> list[str]:
        s = self.sys
        args = [
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--die-with-parent",
            "--as-pid-1",  # no unfiltered bwrap supervisor inside to take over (/proc/1/mem)
            "--new-session",
            "--uid",
            str(NOBODY),
            "--gid",
            str(NOBODY),
            "--hostname",
            "sandbox",
            "--clearenv",
        ]
        for d in s.read_dirs:
            args += ["--ro-bind", self._source(d, True), d]
        for f in s.read_files:
            args += ["--ro-bind", self._source(f, False), f]
        for hidden in s.hidden:
            args += ["--tmpfs", hidden, "--remount-ro", hidden]
        for target, link in s.symlinks:
            args += ["--symlink", target, link]
        # the capped tmpfs holds the working folder and /dev/shm (POSIX semaphores:
        # multiprocessing), so every byte and inode the program can write counts against its caps
        args += ["--proc", "/proc", "--dev", "/dev", "--bind", os.path.join(self.mnt, "shm")]
        args += ["/dev/shm", "--bind", os.path.join(self.mnt, "box"), BOX, "--chdir", BOX]
        for k, v in program_env(BOX).items():
            args += ["--setenv", k, v]
        return args

    def _script(self, group: CallGroup | None, limits: Limits, status: str | None) -> str:
        lines = [f"echo $$ > {shlex.quote(p)} || exit 125" for p in (group.join if group else [])]
        # inodes: the files, and the tmpfs's root and its two folders (box, shm)
        opts = f"size={limits.write_bytes},nr_inodes={limits.files + 3},mode=0700,noexec"
        if self.root:
            opts += f",uid={NOBODY},gid={NOBODY}"
        mnt = shlex.quote(self.mnt)
        lines.append(f"mount -t tmpfs -o {opts},nosuid,nodev rlvr-box {mnt} || exit 125")
        # world-writable and sticky like /tmp (no chown to the program's uid: one process less)
        lines.append(f"mkdir -m 1777 {mnt}/box {mnt}/shm || exit 125")
        for host, staged in self._staged:
            lines.append(
                f"mount --bind -o ro {shlex.quote(host)} {shlex.quote(staged)} || exit 125"
            )
        if status is None:
            lines.append('exec "$@"')
        else:  # stay (outside the sandbox's namespaces) to report the folder's use after the program
            # into a host file the program cannot see (not an inherited descriptor: bwrap passes
            # every open one on to the program, which could write a false report or block this)
            mnt = shlex.quote(self.mnt)
            lines += [
                '"$@"',
                "rc=$?",
                f"stat -f -c '%c %d %b %f %S' {mnt} > {shlex.quote(status)}",
                "exit $rc",
            ]
        return "\n".join(lines)

    def command(
        self,
        argv: Sequence[str],
        fds: dict[str, int],
        limits: Limits,
        group: CallGroup | None,
        status: str | None = None,
    ) -> list[str]:
        t = self.tools
        if self.root:
            ns = [t["unshare"], "--mount", "--propagation", "private", "--"]
            drop = [
                t["setpriv"],
                f"--reuid={NOBODY}",
                f"--regid={NOBODY}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
                "--",
            ]
        else:
            ns = [t["unshare"], "--user", "--map-root-user", "--mount", "--propagation", "private"]
            ns.append("--")
            drop = []
        rl = prlimit_argv(limits, processes=group is None)
        # no file-size limit: the tmpfs caps the bytes (and a SIGXFSZ would look like exit(153))
        rl = [a for a in rl if not a.startswith("--fsize=")]
        if group is not None:  # the cgroup holds memory over the tree; leave address space alone
            rl = [a for a in rl if not a.startswith("--as=")]
        rl[0] = t["prlimit"]
        per_call = ["--seccomp", str(fds.pop("__seccomp__"))]
        made = set()
        for name, fd in fds.items():
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in made:
                    made.add(d)
                    per_call += ["--dir", f"{BOX}/{d}"]
            per_call += ["--file", str(fd), f"{BOX}/{name}"]
        # last: bwrap's root and /dev tmpfs read-only (else writable outside every cap)
        per_call += ["--remount-ro", "/dev", "--remount-ro", "/"]
        # the launcher dies with the trainer (SIGKILL, an OOM kill, a crash): bwrap's
        # --die-with-parent then takes the program's pid namespace down with it
        return [
            t["setpriv"],
            "--pdeathsig=KILL",
            "--",
            *ns,
            t["sh"],
            "-c",
            self._script(group, limits, status),
            "rlvr-sandbox",
            *drop,
            *rl,
            t["bwrap"],
            *self._fixed,
            *per_call,
            "--",
            *resolve_argv(argv),
        ]

    # -- one call ----------------------------------------------------------------------

    def run(
        self,
        argv: Sequence[str],
        *,
        files: Mapping[str, str | bytes] = {},  # noqa: B006 - read only
        stdin: str | bytes = b"",
        limits: Limits = Limits(),  # noqa: B008 - frozen
    ) -> Result:
        contents = check_files(files)
        if len(contents) > limits.files:
            raise ValueError(f"{len(contents)} files given, over Limits.files={limits.files}")
        fds: dict[str, int] = {}
        group = None
        status = os.path.join(self.home, f"status-{next(_calls)}")
        try:
            fds["__seccomp__"] = _memfd("seccomp", self.seccomp)
            for name, data in contents.items():
                fds[name] = _memfd("file", data)
            passed = list(fds.values())
            if self.cgroups is not None:
                # + bwrap and its pid-1: the program's own processes get `processes`
                group = self.cgroups.new_call(limits.memory_mb * 2**20, limits.processes + 2)
            cmd = self.command(argv, dict(fds), limits, group, status)
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
                cmd,
                stdin=stdin.encode() if isinstance(stdin, str) else bytes(stdin),
                wall_s=limits.wall_s,
                output_bytes=limits.output_bytes,
                pass_fds=passed,
                kill=kill,
                watch=watch,
            )
            usage = _read_status(status)
            code = _exit_code(raw.returncode, group.cpu_s() if group is not None else None, limits)
            limit = self._limit(raw, code, limits, group, usage)
        finally:
            for fd in fds.values():
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(status)
            if group is not None:
                group.kill_all()
                group.remove()
        return Result(
            code,
            decode(raw.stdout),
            decode(raw.stderr),
            raw.timed_out,
            limit,
            raw.wall_s,
            self.name,
        )

    def _limit(
        self,
        raw,
        code: int | None,
        limits: Limits,
        group: CallGroup | None,
        usage: tuple[int, int] | None,
    ) -> str | None:
        if raw.timed_out:
            return "wall"
        if raw.stopped:
            return raw.stopped
        if group is not None and group.oom_killed():
            return "memory"
        cpu = group.cpu_s() if group is not None else None
        named = limit_from_exit(code, limits, cpu)
        if named:
            return named
        if group is not None and group.pids_hit():
            return "processes"
        if usage is not None:
            free_inodes, free_bytes = usage
            if free_inodes <= 0:
                return "files"
            if free_bytes < 4096:
                return "write"
        if group is None and raw.stderr.rstrip().endswith(b"MemoryError"):
            return "memory"  # the address-space limit, where no cgroup sums the tree
        if raw.output_cut:
            return "output"
        return None


def _exit_code(code: int | None, cpu_used: float | None, limits: Limits) -> int | None:
    """The program's exit status: bwrap reports a death by signal N as 128 + N, the number an
    exit code of 128 + N also gives (``sys.exit(152)`` is not SIGXCPU). Read as a signal
    unless it cannot have been one: SIGXFSZ (no file-size limit here: the tmpfs caps the bytes)
    and SIGXCPU where the cgroup counted less CPU than the limit. Other numbers stay ambiguous."""
    if code is None or not 128 < code <= 128 + 64:
        return code
    sig = code - 128
    if sig == signal.SIGXFSZ:
        return code
    if sig == signal.SIGXCPU and cpu_used is not None and cpu_used < limits.cpu_s:
        return code
    return -sig


def _read_status(path: str) -> tuple[int, int] | None:
    """(free inodes, free bytes) of the working folder, as the launcher saw them at the end."""
    data = b""
    with contextlib.suppress(OSError), open(path, "rb") as f:
        data = f.read(256)
    try:
        _, free_inodes, _, free_blocks, block = (int(x) for x in data.split())
    except ValueError:
        return None
    return free_inodes, free_blocks * block


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(f"rlvr-{name}")  # close-on-exec; pass_fds opens it to the launcher
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
