"""Symbolic equivalence with math-verify, time-bounded from any thread.

math-verify bounds its own work with ``signal.alarm``, which only works in the main
thread; from a trainer's worker thread it raises. We therefore run it in a sandbox
child process (where it *is* the main thread, so its alarms act as a soft limit that
keeps the child alive) and let the parent kill the child at the hard limit. Only
``LatexExtractionConfig`` is used: math-verify's plain-expression mode goes through
sympy's ``parse_expr``, which calls ``eval`` on the text.

Results are cached per (reference, answer) pair, since the G samples of one prompt often
give the same answer.
"""

from __future__ import annotations

import threading
from functools import lru_cache

from rlvr.rewards.sandbox import SandboxError, SandboxTimeout, SandboxWorker, WorkerDied

__all__ = ["SymbolicTimeout", "shutdown", "symbolic_equal", "verify_latex", "warm_up"]

# The child may use at most this much address space: 10^(10^10) needs 4 GiB and fails
# fast with MemoryError instead of paging the machine.
MEMORY_LIMIT_MB = 2048
_TARGET = "rlvr.rewards.symbolic:verify_latex"
_lock = threading.Lock()
_worker: SandboxWorker | None = None


class SymbolicTimeout(Exception):
    """The symbolic check ran out of time or memory; the answer is graded as wrong."""


def verify_latex(gold: str, pred: str, soft_timeout_s: int) -> bool | None:
    """Runs in the child: True/False, or None when math-verify gave up (time or memory)."""
    from math_verify import LatexExtractionConfig, parse, verify
    from math_verify.errors import TimeoutException

    config = [LatexExtractionConfig()]
    try:
        gold_parsed = parse(f"${gold}$", extraction_config=config, parsing_timeout=soft_timeout_s)
        pred_parsed = parse(f"${pred}$", extraction_config=config, parsing_timeout=soft_timeout_s)
        if not gold_parsed or not pred_parsed:
            return False
        return bool(
            verify(gold_parsed, pred_parsed, timeout_seconds=soft_timeout_s, raise_on_error=True)
        )
    except (TimeoutException, MemoryError, RecursionError):
        return None
    except Exception:  # noqa: BLE001 - an unparseable or incomparable answer is not equal
        return False


def _get_worker() -> SandboxWorker:
    global _worker
    if _worker is None:
        _worker = SandboxWorker(preload=("math_verify",), memory_limit_mb=MEMORY_LIMIT_MB)
    return _worker


def warm_up() -> None:
    """Start the child now (it takes about a second to import sympy) instead of on first use."""
    with _lock:
        _get_worker().start()


def shutdown() -> None:
    """Kill the child; the next ``symbolic_equal`` starts a new one."""
    global _worker
    with _lock:
        if _worker is not None:
            _worker.kill()
            _worker = None


@lru_cache(maxsize=4096)
def _cached_equal(gold: str, pred: str, timeout_s: float) -> bool:
    soft = max(1, int(timeout_s / 3))
    with _lock:
        try:
            result = _get_worker().call(_TARGET, (gold, pred, soft), timeout_s=timeout_s)
        except (SandboxTimeout, WorkerDied) as exc:
            raise SymbolicTimeout(str(exc)) from exc
        except SandboxError:
            return False
    if result is None:
        raise SymbolicTimeout("math-verify gave up (time or memory)")
    return bool(result)


def symbolic_equal(gold: str, pred: str, timeout_s: float = 2.0) -> bool:
    """True if ``pred`` equals ``gold`` symbolically; raises SymbolicTimeout past ``timeout_s``.

    Both are LaTeX answer strings already screened by ``guards.symbolic_guard``. Timeouts
    are not cached (a later call may succeed).
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    return _cached_equal(gold, pred, float(timeout_s))
