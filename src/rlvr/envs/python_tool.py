"""A Python tool: the model writes ``<python>CODE</python>``, the environment answers
``<output>...</output>``; a turn without a call ends the episode and the reward specs grade it.

The code runs in the sandbox (rlvr.sandbox, ``sandbox.backend``; docs/sandbox.md): one fresh
sandboxed process per call, in its own empty folder, no network, none of the trainer's files,
processes or environment, time, memory, process, file and output limits over its whole process
tree (rlvr.envs.python_exec words the result). Constructing the tool checks that a sandbox
works here, so env.name=python refuses to start where none does (unless
``sandbox.backend=unsafe_local`` says to run the code bare).

Concurrency: the episodes of a step call the tool at once, each from its own thread
(rlvr.envs.contain). A call waits for one of the process's sandbox slots (``sandbox.concurrency``)
and its time limit starts with its program, so a wait is never reported as the snippet's time.
"""

from __future__ import annotations

from rlvr.envs.base import ToolEnv
from rlvr.envs.python_exec import run_snippet
from rlvr.sandbox import require_sandbox

INSTRUCTIONS = (
    "You may run Python: write <python>code</python> and what it prints comes back as "
    "<output>text</output>. Give the final answer as a number."
)


def run_python(
    code: str, timeout_s: float, memory_mb: int, max_output_chars: int, sandbox: str | None = None
) -> dict:
    """Run ``code`` in the sandbox; ``{"ok", "output", "timed_out", "limit"}``."""
    return run_snippet(code, timeout_s, memory_mb, max_output_chars, sandbox)


class PythonToolEnv(ToolEnv):
    """Python tool calls until the model answers without one."""

    tag, result_tag, instructions_text = "python", "output", INSTRUCTIONS
    runs_model_code = True  # config checks refuse it where no sandbox works

    def __init__(
        self,
        instructions: bool = True,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        max_output_chars: int = 1000,
        sandbox: str | None = None,
    ) -> None:
        super().__init__(instructions)
        require_sandbox("env.name=python", sandbox)
        self.timeout_s, self.memory_mb, self.max_output_chars = (
            timeout_s,
            memory_mb,
            max_output_chars,
        )
        self.sandbox = sandbox

    def call(self, argument: str) -> tuple[str, bool]:
        result = run_python(
            argument, self.timeout_s, self.memory_mb, self.max_output_chars, self.sandbox
        )
        return result["output"].strip(), bool(result["ok"])
