"""A Python tool: the model writes ``<python>CODE</python>``, the environment answers
``<output>...</output>``; a turn without a call ends the episode and the reward specs grade it.

The code never runs in the trainer's process: a sandbox worker (the reward sandbox's killable
child processes, rlvr.rewards.sandbox) runs it in a fresh interpreter with no network, no writes
outside its own temporary directory, memory and time limits and truncated output
(rlvr.envs.python_exec). The workers are shared by the episodes of the process (a few at a
time), started on first use and killed at exit.
"""

from __future__ import annotations

import queue
import threading

from rlvr.envs.base import ToolEnv
from rlvr.rewards.sandbox import SandboxError, SandboxTimeout, SandboxWorker, WorkerDied

INSTRUCTIONS = (
    "You may run Python: write <python>code</python> and what it prints comes back as "
    "<output>text</output>. Give the final answer as a number."
)
MAX_WORKERS = 4

_idle: queue.LifoQueue[SandboxWorker] = queue.LifoQueue()
_lock = threading.Lock()
_started = 0


def _checkout() -> SandboxWorker:
    global _started
    with _lock:
        if _idle.empty() and _started < MAX_WORKERS:
            _started += 1
            return SandboxWorker(preload=("rlvr.envs.python_exec",))
    return _idle.get()


def run_python(code: str, timeout_s: float, memory_mb: int, max_output_chars: int) -> dict:
    """Run ``code`` in a sandbox worker; ``{"ok", "output", "timed_out"}``."""
    worker = _checkout()
    try:
        return worker.call(
            "rlvr.envs.python_exec:run_snippet",
            (code, timeout_s, memory_mb, max_output_chars),
            timeout_s=timeout_s + 10.0,  # the snippet's own limit ends it first
        )
    except (SandboxError, SandboxTimeout, WorkerDied) as exc:
        return {"ok": False, "output": f"tool error: {exc}", "timed_out": True}
    finally:
        _idle.put(worker)


class PythonToolEnv(ToolEnv):
    """Python tool calls until the model answers without one."""

    tag, result_tag, instructions_text = "python", "output", INSTRUCTIONS

    def __init__(
        self,
        instructions: bool = True,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        max_output_chars: int = 1000,
    ) -> None:
        super().__init__(instructions)
        self.timeout_s, self.memory_mb, self.max_output_chars = (
            timeout_s,
            memory_mb,
            max_output_chars,
        )

    def call(self, argument: str) -> tuple[str, bool]:
        result = run_python(argument, self.timeout_s, self.memory_mb, self.max_output_chars)
        return result["output"].strip(), bool(result["ok"])
