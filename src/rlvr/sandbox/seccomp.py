"""The seccomp filter every sandboxed process runs under, compiled once to a BPF program with
libseccomp (PyPI ``pyseccomp``: ctypes over the system's libseccomp.so.2).

Default allow, with a deny list: the calls a program has no business making and that widen the
kernel surface or reach other processes (ptrace, process_vm_*, mount and the new mount API,
bpf, keyring, perf events, kexec, modules, namespaces, userfaultfd, io_uring, file handles,
xattr writes, the clock, swap, reboot, terminal injection). ``clone`` with any namespace flag is
refused, and ``clone3`` answers ENOSYS (its flags sit in memory a filter cannot read), so libc
falls back to ``clone``, whose flags it can. Socket families other than AF_UNIX (and, where a
network namespace already isolates, AF_INET/AF_INET6) are refused. Calls of another
architecture's ABI (i386 ``int 0x80`` on x86-64) kill the process: libseccomp's default for an
architecture the filter does not name.
"""

from __future__ import annotations

import errno
import functools
import socket
import tempfile

DENY = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr",
    "bpf", "keyctl", "add_key", "request_key", "perf_event_open", "fanotify_init",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "unshare", "setns", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "open_by_handle_at", "name_to_handle_at",
    "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr",
    "swapon", "swapoff", "reboot", "syslog", "acct", "quotactl", "quotactl_fd",
    "lookup_dcookie", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "iopl", "ioperm", "vhangup", "uselib", "ustat", "sysfs", "_sysctl", "personality",
    "mbind", "migrate_pages", "move_pages", "set_mempolicy", "nfsservctl",
)  # fmt: skip
CLONE_NS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
CLONE_NEWTIME = 0x00000080
TIOCSTI, TIOCLINUX = 0x5412, 0x541C


@functools.cache
def bpf(allow_inet: bool, allow_unix: bool = True) -> bytes:
    """The filter as a BPF program (``struct sock_filter[]``), for bwrap's ``--seccomp FD`` or
    ``prctl(PR_SET_SECCOMP)``; ``allow_inet``: AF_INET/AF_INET6 sockets allowed (only where a
    network namespace holds the program); ``allow_unix``: AF_UNIX sockets (where no network
    namespace hides the trainer's: with False only ``socketpair`` makes them)."""
    import pyseccomp as sc

    f = sc.SyscallFilter(defaction=sc.ALLOW)
    eperm = sc.ERRNO(errno.EPERM)
    for name in DENY:
        try:
            f.add_rule(eperm, name)
        except OSError:  # a call this kernel/libseccomp does not know
            continue
    for flag in [1 << i for i in range(32) if CLONE_NS >> i & 1] + [CLONE_NEWTIME]:
        f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for req in (TIOCSTI, TIOCLINUX):
        f.add_rule(eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, req))
    allowed = ({socket.AF_UNIX} if allow_unix else set()) | (
        {socket.AF_INET, socket.AF_INET6} if allow_inet else set()
    )
    for family in range(0, 64):
        if family not in allowed:
            f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.EQ, family))
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()
