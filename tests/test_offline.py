"""rlvr.offline: the hub probed once; the offline switches set only where it cannot be reached."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlvr import offline
from rlvr.rollout.server_launch import free_port


class _NotFound(BaseHTTPRequestHandler):
    def do_HEAD(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(404)  # any answer means the hub is reachable
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def clean_env(monkeypatch):
    for var in (*offline.OFFLINE_VARS, offline.PROBED_VAR):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_an_endpoint_that_answers_is_reachable(clean_env) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        clean_env.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
        assert offline.probe_hub(timeout_s=5) is None
    finally:
        server.shutdown()
        server.server_close()


def test_a_closed_port_switches_offline_once(clean_env) -> None:
    import os

    endpoint = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    clean_env.setenv("HF_ENDPOINT", endpoint)
    assert "refused" in (offline.probe_hub(timeout_s=5) or "").lower()
    # this process imported the hub libraries long ago: too late to switch, nothing is probed
    assert offline.offline_if_unreachable() is None
    assert offline.PROBED_VAR not in os.environ
    clean_env.setattr(offline, "hub_libraries_imported", lambda: False)  # a fresh CLI process
    line = offline.offline_if_unreachable(timeout_s=5)
    assert line is not None and line.startswith(f"[rlvr] the Hugging Face hub ({endpoint}) is not")
    assert all(os.environ[v] == "1" for v in offline.OFFLINE_VARS)
    assert offline.offline_if_unreachable() is None  # once per process tree


def test_a_user_who_set_offline_is_not_probed(clean_env) -> None:
    import os

    clean_env.setenv("HF_HUB_OFFLINE", "1")
    clean_env.setattr(offline, "probe_hub", lambda *a, **k: pytest.fail("probed"))
    assert offline.offline_if_unreachable() is None
    assert offline.PROBED_VAR not in os.environ
