"""How many compiled oneDNN primitives a process keeps: fewer than oneDNN's 1024 by default.

On the CPU, PyTorch runs bf16 matmuls through oneDNN, which compiles a primitive for every new
combination of shapes and keeps up to ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` of them (1024 unless
set). A training run meets many shapes: decoding steps whose batch shrinks as replies finish and
whose key/value length grows, micro-batches of varying width. Each kept primitive holds memory,
so with oneDNN's default cache the resident set grows for the first steps of a run; a
smaller cache lowers the peak at an equal step time (docs/performance.md).

oneDNN reads the variable once, when it first compiles a primitive, so it is set before the
model loads; a value already in the environment wins, and 0 leaves oneDNN's default.
"""

from __future__ import annotations

import os

ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def bound(capacity: int, env: dict[str, str] | os._Environ = os.environ) -> None:
    """Set ``ENV`` to ``capacity`` unless the environment already has it or ``capacity`` is 0."""
    if capacity and ENV not in env:
        env[ENV] = str(capacity)


def in_effect(env: dict[str, str] | os._Environ = os.environ) -> str:
    """The capacity this process's oneDNN uses, for the run's first lines and summary.json."""
    return env.get(ENV, "1024 (oneDNN default)")
