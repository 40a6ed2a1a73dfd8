"""The sandbox backends that work on this machine (a plain module: test files import it by
name): the code reward's tests run on each, the attacks only on the ones that isolate."""

from __future__ import annotations

from rlvr.sandbox import SandboxUnavailable, get_sandbox
from rlvr.sandbox.select import LOCAL_BACKENDS, UNSAFE


def working_backends(*, safe_only: bool = False) -> list[str]:
    """The names, strongest first, whose probe passes here; unsafe_local last unless left out."""
    out = []
    for name in [*LOCAL_BACKENDS, *(() if safe_only else (UNSAFE,))]:
        try:
            get_sandbox(name)
        except SandboxUnavailable:
            continue
        out.append(name)
    return out
