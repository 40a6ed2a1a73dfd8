"""One sandbox for everything that runs model-written code (docs/sandbox.md).

    box = get_sandbox()                      # sandbox.backend (auto: the strongest that works)
    r = box.run(["python3", "main.py"], files={"main.py": code}, stdin="3 4\\n",
                limits=Limits(wall_s=5))
    r.returncode, r.stdout, r.stderr, r.timed_out, r.limit, r.wall_s, r.backend

Backends: ``bwrap`` (bubblewrap: every namespace, seccomp, a cgroup), ``landlock`` (where
bubblewrap cannot run), ``unsafe_local`` (no isolation; by name only, loudly warned), or a
``package.module:Factory`` of your own (a remote service). Callers that run model code call
`require_sandbox` first, so a machine with no sandbox refuses instead of running it bare.
"""

from rlvr.sandbox.base import LIMIT_NAMES, Limits, Result, Sandbox, SandboxUnavailable
from rlvr.sandbox.select import (
    BACKENDS,
    UNSAFE,
    concurrency,
    configure,
    default_limits,
    describe,
    get_sandbox,
    in_use,
    require_sandbox,
    sandbox_problem,
)

__all__ = [
    "BACKENDS",
    "LIMIT_NAMES",
    "UNSAFE",
    "Limits",
    "Result",
    "Sandbox",
    "SandboxUnavailable",
    "concurrency",
    "configure",
    "default_limits",
    "describe",
    "get_sandbox",
    "in_use",
    "require_sandbox",
    "sandbox_problem",
]
