"""Facts about the machine and the workers: matmul peak, load, peak resident memory."""

from __future__ import annotations

import contextlib
import os
import platform
import threading
import time
from pathlib import Path

import psutil


def matmul_peak_flops(
    *, n: int = 2048, dtype: str = "bfloat16", threads: int = 2, reps: int = 8
) -> float:
    """Best FLOP/s of ``torch.matmul`` on two ``[n, n]`` matrices of ``dtype`` with ``threads``.

    One multiply is ``2 n^3`` FLOPs. The best of ``reps`` timed runs (after two warm-up runs) is
    the peak: on a shared machine the best run is the one least disturbed by other work.
    """
    import torch

    dt = {"bfloat16": torch.bfloat16, "float32": torch.float32}.get(dtype)
    if dt is None:
        raise ValueError(f"dtype={dtype!r}; known: bfloat16, float32")
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.randn(n, n, generator=g).to(dt)
        b = torch.randn(n, n, generator=g).to(dt)
        for _ in range(2):
            torch.matmul(a, b)
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            torch.matmul(a, b)
            best = min(best, time.perf_counter() - t)
    finally:
        torch.set_num_threads(old)
    return 2.0 * n**3 / best


def memory_bandwidth(*, mib: int = 256, threads: int = 2, reps: int = 6) -> float:
    """Best bytes/s of copying a ``mib`` MiB float32 tensor into another with ``threads``.

    A copy reads and writes every byte, so one copy moves ``2 x mib`` MiB. The tensor is far
    larger than the caches, so this is the DRAM bandwidth a decoding step's weight reads see.
    """
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        src = torch.ones(mib * 2**20 // 4)
        dst = torch.empty_like(src)
        dst.copy_(src)  # first touch: page faults are not bandwidth
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t)
    finally:
        torch.set_num_threads(old)
    return 2.0 * mib * 2**20 / best


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


# environment variables that cap the instruction set oneDNN, ATen and MKL use
ISA_LIMIT_VARS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")


def machine_info() -> dict:
    """CPU model, core count, RAM and OS of this machine."""
    model = platform.processor() or "unknown"
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": psutil.cpu_count(logical=True),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "avx512_bf16": "avx512_bf16" in flags,
        # set, these make a CPU behave like an older one (e.g. AVX2 only): a run under them
        # must say so
        "isa_limits": {k: os.environ[k] for k in ISA_LIMIT_VARS if os.environ.get(k)},
        "python": platform.python_version(),
        "os": platform.platform(),
    }


def tree_rss(pid: int) -> int:
    """Resident bytes of process ``pid`` plus all its descendants (0 once it has exited)."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        # a child may exit between listing and reading
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += p.memory_info().rss
    return total


class PeakRss:
    """Samples a process tree's resident memory in a background thread; ``peak`` is the maximum."""

    def __init__(self, pid: int, interval_s: float = 0.2):
        self.pid = pid
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss(self.pid))
            self._stop.wait(self.interval_s)

    def start(self) -> PeakRss:
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


PRECISIONS = ("bf16", "float32")
# the matmul-peak key of each precision (``matmul_peak_flops`` dtype names)
PEAK_DTYPE = {"bf16": "bfloat16", "float32": "float32"}
DTYPE_BYTES = {"bf16": 2, "float32": 4}


def bench_precision(choice: str, bf16_fast: bool) -> tuple[str, str]:
    """The precision every side trains and generates in, and why.

    ``auto`` picks what a user gets by default on this machine (rlvr's ``model.autocast=auto``):
    bf16 where the CPU has a bf16 fast path, float32 elsewhere, where bf16 matmuls are emulated
    and slower. ``bf16`` or ``float32`` force one. Both sides always run the same precision.
    """
    if choice == "auto":
        if bf16_fast:
            return "bf16", "auto: this CPU has a bf16 fast path"
        return "float32", "auto: this CPU has no bf16 fast path (bf16 would be emulated)"
    if choice not in PRECISIONS:
        raise ValueError(f"--precision={choice!r}; known: auto, {', '.join(PRECISIONS)}")
    return choice, "forced by --precision"
