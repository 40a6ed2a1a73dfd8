"""Every backend that works on this machine, as the ``box`` fixture (unsafe_local always)."""

from __future__ import annotations

import pytest

from rlvr.sandbox import SandboxUnavailable, get_sandbox

BACKENDS = ("bwrap", "landlock", "unsafe_local")


def available(name: str):
    try:
        return get_sandbox(name)
    except SandboxUnavailable:
        return None


@pytest.fixture(params=BACKENDS)
def box(request):
    sandbox = available(request.param)
    if sandbox is None:
        pytest.skip(f"sandbox backend {request.param} does not run here")
    return sandbox
