"""Run one snippet of the Python tool in the sandbox (rlvr.sandbox) and word its result for the
model: what it printed (stdout, then stderr), cut to ``max_output_chars``, and a closing note
when a limit ended it ("[timed out after 5.0 s]", "[memory limit: 512 MB]", ...).

The snippet is the file ``snippet.py`` in the call's working folder, run by the sandbox's
``python3`` (the standard library only). Everything that holds it in (no network, no view of
the trainer's files, processes or environment, limits over its whole process tree) is the
sandbox's: nothing runs inside the snippet's interpreter to police it.
"""

from __future__ import annotations

from rlvr.sandbox import Limits, Result, default_limits, get_sandbox

NOTES = {
    "memory": "[memory limit: {memory_mb} MB]",
    "cpu": "[CPU time limit: {cpu_s} s]",
    "processes": "[process limit: {processes}]",
    "files": "[file limit: {files} files]",
    "write": "[write limit: {write_bytes} bytes]",
}


def snippet_limits(timeout_s: float, memory_mb: int, max_output_chars: int) -> Limits:
    """The sandbox limits of one tool call: the tool's own time and memory, output enough for
    ``max_output_chars`` characters of UTF-8, the rest from the ``sandbox`` section."""
    return default_limits(
        wall_s=timeout_s,
        cpu_s=timeout_s,
        memory_mb=memory_mb,
        output_bytes=max(4096, 4 * max_output_chars + 4),
    )


def word_result(r: Result, limits: Limits, max_output_chars: int) -> dict:
    """``{"ok", "output", "timed_out", "limit"}`` as the tool answers the model."""
    text = r.stdout + r.stderr
    if len(text) > max_output_chars or r.limit == "output":
        text = text[:max_output_chars] + "\n[output truncated]"
    if r.timed_out:
        text += f"\n[timed out after {limits.wall_s} s]"
    elif r.limit in NOTES:
        text += "\n" + NOTES[r.limit].format(**limits.__dict__)
    elif r.returncode is not None and r.returncode < 0:
        text += f"\n[killed by signal {-r.returncode}]"
    ok = r.returncode == 0 and not r.timed_out and r.limit in (None, "output")
    return {"ok": ok, "output": text, "timed_out": r.timed_out, "limit": r.limit}


def run_snippet(
    code: str,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    max_output_chars: int = 2000,
    sandbox: str | None = None,
) -> dict:
    """Run ``code``; ``{"ok": exit 0 within the limits, "output": text, "timed_out", "limit"}``.
    ``sandbox``: a ``sandbox.backend`` name (None: the run's)."""
    limits = snippet_limits(timeout_s, memory_mb, max_output_chars)
    r = get_sandbox(sandbox).run(
        ["python3", "snippet.py"], files={"snippet.py": code}, limits=limits
    )
    return word_result(r, limits, max_output_chars)
