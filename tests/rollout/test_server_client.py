"""rollout.mode=server, the parts that need no vLLM: the error when the server is down, the
per-prompt seeds and the reading of a server reply (its weight-version label per completion)."""

from __future__ import annotations

import pytest
import torch

from rlvr.cli.main import main as cli_main
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.server import ServerEngine, parse_choice, request_seeds
from rlvr.rollout.server_launch import free_port
from rlvr.training.preflight.checks import config_problems


def _dead_url() -> str:
    return f"http://127.0.0.1:{free_port('127.0.0.1')}"  # nothing listens there


def test_engine_reports_the_address_when_the_server_is_down():
    url = _dead_url()
    with pytest.raises(ConnectionError, match=f"rollout server at {url} is not reachable"):
        ServerEngine(url, dtype=torch.float32, tied=True)


def test_rlvr_train_fails_cleanly_naming_the_address(tiny_model_dir, tmp_path, capsys):
    url = _dead_url()
    code = cli_main(
        [
            "train",
            f"model.name_or_path={tiny_model_dir}",
            f"train.output_dir={tmp_path}",
            "data.template=none",
            "logging.progress=false",
            "model.autocast=off",
            "rollout.engine=vllm",
            "rollout.mode=server",
            f"rollout.server_url={url}",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert f"rlvr: error: rollout server at {url} is not reachable" in err
    assert "rlvr rollout-server" in err  # says how to start one


def test_a_taken_port_is_refused_before_starting_a_server(tiny_model_dir, tmp_path):
    """Otherwise the health check could reach whatever listens there instead of our server."""
    import socket

    from rlvr.config import load_config
    from rlvr.model.loading import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(str(tiny_model_dir), dtype=torch.float32, device="cpu")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = load_config(None, ["rollout.mode=server", f"rollout.server_port={port}"])
        with pytest.raises(ValueError, match=f"rollout.server_port={port} is in use"):
            ServerEngine.from_trainer(cfg, model, tok, workdir=tmp_path)
    assert not list(tmp_path.iterdir())  # nothing exported, nothing started


def test_a_port_left_in_time_wait_by_a_previous_run_is_free():
    """A run right after a run: the previous server's connections leave its port in TIME_WAIT
    for about a minute. The vLLM server binds with SO_REUSEADDR (uvicorn does), so it would
    start; the check must agree with it, not refuse the port."""
    import socket
    from pathlib import Path

    from rlvr.rollout.server_launch import check_port_free

    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server closes first: its end of the connection enters TIME_WAIT
    assert client.recv(1) == b""
    client.close()
    server.close()
    # the state the fix is about, really there: /proc/net/tcp state 06 is TIME_WAIT
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    assert any(r[1] == f"0100007F:{port:04X}" and r[3] == "06" for r in rows)
    check_port_free("127.0.0.1", port)  # no ValueError
    # and a port a server still listens on is still refused (SO_REUSEADDR does not share it)
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", port))
        taken.listen()
        with pytest.raises(ValueError, match=f"rollout.server_port={port} is in use"):
            check_port_free("127.0.0.1", port)


def test_server_mode_needs_the_vllm_engine():
    from rlvr.config import load_config

    cfg = load_config(None, ["rollout.mode=server", "rollout.engine=hf"])
    assert "rollout.mode=server serves vLLM: set rollout.engine=vllm (or auto)" in config_problems(
        cfg
    )


def test_every_prompt_gets_its_own_seed():
    # explicit per-prompt seeds pass through; otherwise derived from the step seed and the index
    assert request_seeds(SamplingParams(prompt_seeds=(5, 9)), 2) == [5, 9]
    assert request_seeds(SamplingParams(seed=2), 3) == [2_000_006, 2_000_007, 2_000_008]
    assert request_seeds(SamplingParams(), 2) == [None, None]
    with pytest.raises(ValueError, match="1 prompt seeds for 2 prompts"):
        request_seeds(SamplingParams(prompt_seeds=(1,)), 2)


def _choice(versions, tokens=(4, 3), finish="stop") -> dict:
    return {
        "index": 0,
        "finish_reason": finish,
        "token_ids": list(tokens),
        "text": "ab",
        "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -1.25}][: len(tokens)]},
        "weight_versions": [{"version": v, "start": 0, "end": 2} for v in versions],
    }


def test_a_reply_becomes_a_completion_with_the_servers_version_label():
    c = parse_choice(3, _choice(["7"]))
    assert (c.prompt_index, c.token_ids, c.logprobs, c.text) == (3, [4, 3], [-0.5, -1.25], "ab")
    assert c.policy_version == 7 and not c.truncated
    # a server never synced by a trainer labels its weights "default": no version
    assert parse_choice(0, _choice(["default"])).policy_version is None
    with pytest.raises(RuntimeError, match="several weight versions"):
        parse_choice(0, _choice(["1", "2"]))
    with pytest.raises(RuntimeError, match="no log-prob"):
        parse_choice(0, _choice(["1"], tokens=(4, 3, 2)))


def test_a_server_without_the_weight_receiver_fails_at_once_not_at_the_group_timeout():
    """A plain `vllm serve` (no rlvr worker extension) answers /health but fails the
    rlvr_join call; the trainer must raise that error, not wait for the weight group to form
    until its timeout. Stand-in server: stdlib HTTP, the same two answers vLLM gives."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # /health
            self.send_response(200)
            self.end_headers()

        def do_POST(self):  # /collective_rpc: vLLM's error for a method the worker lacks
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b'{"error": "Method rlvr_join is not implemented"}'
            self.send_response(500)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    t = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="rlvr_join is not implemented"):
            ServerEngine(url, dtype=torch.float32, tied=True, timeout_s=60)
    finally:
        httpd.shutdown()
    assert time.monotonic() - t < 10  # not the 60 s group timeout


def test_the_weight_group_store_listens_on_the_sync_host_only():
    """The trainer's side of the weight-sync group hosts a TCPStore; torch's listens on every
    interface whatever host it is given (measured: ``*:PORT``), so whoever reached the trainer's
    sync port could join the rendezvous. It now listens on ``rollout.sync_host`` alone, and the
    group still forms and carries a broadcast."""
    import subprocess
    import threading
    from datetime import timedelta

    from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

    from rlvr.rollout.server_launch import free_port
    from rlvr.rollout.server_worker import group_prefix, trainer_group

    host, port = "127.0.0.1", free_port("127.0.0.1")
    out: dict = {}

    def trainer():
        out["group"], out["store"] = trainer_group(host, port, 2, "gloo", 60)

    t = threading.Thread(target=trainer)
    t.start()
    store = TCPStore(host, port, 2, is_master=False, timeout=timedelta(seconds=60))
    listening = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout
    worker = ProcessGroupGloo(PrefixStore(group_prefix(host, port), store), 1, 2, timedelta(60))
    t.join(60)
    local = [
        line.split()[3] for line in listening.splitlines() if line.split()[3].endswith(f":{port}")
    ]
    assert local == [f"{host}:{port}"], local
    sent, got = torch.arange(6.0), torch.zeros(6)
    opts = torch.distributed.BroadcastOptions()
    opts.rootRank = 0
    work = out["group"].broadcast([sent], opts)
    worker.broadcast([got], opts).wait()
    work.wait()
    assert torch.equal(got, sent)


def test_a_pause_cut_short_in_flight_is_undone_and_a_connecting_trainer_resumes_the_server(
    monkeypatch,
):
    """rollout.partial: a Ctrl-C, or a stop signal's Preempted raised in an evaluation's push,
    may land while ``/pause`` is in flight, after the server paused: the client must still
    resume it, else every later generation on that server (a standalone `rlvr rollout-server`
    outlives the trainer) waits forever (no timeout on /inference/v1/generate). And a trainer
    that connects resumes a server a previous one left paused."""
    import rlvr.rollout.server as srv

    server = {"paused": False, "calls": []}

    def post(url, path, body, **kw):
        server["calls"].append(path)
        if path.startswith("/pause"):
            server["paused"] = True  # the server paused; the answer never reaches the client
            raise KeyboardInterrupt
        if path == "/resume":
            server["paused"] = False
        return {}

    monkeypatch.setattr(srv, "http_post", post)
    monkeypatch.setattr(srv, "http_get", lambda *a, **k: {})
    monkeypatch.setattr(ServerEngine, "_join", lambda self, host, port: None)
    engine = ServerEngine("http://127.0.0.1:1", dtype=torch.float32, tied=True, partial=True)
    with pytest.raises(KeyboardInterrupt), engine.paused():
        pytest.fail("the block runs only once the server paused")
    assert not server["paused"] and server["calls"][-1] == "/resume"
    server["paused"] = True  # left so by a trainer killed inside its push
    ServerEngine("http://127.0.0.1:1", dtype=torch.float32, tied=True)
    assert not server["paused"]


def _engine_over(monkeypatch, post) -> ServerEngine:
    """A ServerEngine whose HTTP posts go to ``post`` (a stand-in server), with no weight group
    and no sleeps between reset retries."""
    import rlvr.rollout.server as srv

    monkeypatch.setattr(srv, "http_post", post)
    monkeypatch.setattr(srv, "http_get", lambda *a, **k: {})
    monkeypatch.setattr(ServerEngine, "_join", lambda self, host, port: None)
    monkeypatch.setattr("rlvr.rollout.weight_sync.time.sleep", lambda s: None)
    return ServerEngine("http://127.0.0.1:1", dtype=torch.float32, tied=True)


def test_a_prefix_cache_reset_vllm_refuses_is_retried_then_raised(monkeypatch):
    """vLLM's ``/reset_prefix_cache`` answers ``{"success": false}`` while blocks are still held
    (running requests, KV transfers; "callers may retry"). Ignored, the next requests would reuse
    the KV cache the old weights computed for a shared prompt prefix: retried, then raised."""
    answers = {"left": 2, "calls": 0}

    def post(url, path, body, **kw):
        if path.startswith("/reset_prefix_cache"):
            answers["calls"] += 1
            answers["left"] -= 1
            return {"success": answers["left"] < 0}
        return {}

    engine = _engine_over(monkeypatch, post)
    engine._reset_prefix_cache()
    assert answers["calls"] == 3  # two refusals, then success

    answers.update(left=10**6, calls=0)
    with pytest.raises(RuntimeError, match="the prefix cache could not be dropped"):
        engine._reset_prefix_cache()
    assert answers["calls"] > 3


def test_requests_of_other_clients_are_preempted_rather_than_the_run_stopped(monkeypatch, capsys):
    """A standalone `rlvr rollout-server` may serve other clients too: their requests in flight
    at a push hold KV blocks, and the plain reset keeps failing. After the retries the reset
    preempts them (vLLM's ``reset_running_requests=true``: they recompute on the new weights),
    said once; only if that fails too does the run stop."""

    calls = []
    forced_ok = {"value": True}

    def post(url, path, body, **kw):
        calls.append(path)
        if path == "/reset_prefix_cache":
            return {"success": False}  # another client's long request holds blocks
        if path == "/reset_prefix_cache?reset_running_requests=true":
            return {"success": forced_ok["value"]}
        return {}

    engine = _engine_over(monkeypatch, post)
    engine._reset_prefix_cache()
    assert calls.count("/reset_prefix_cache?reset_running_requests=true") == 1
    assert calls.index("/reset_prefix_cache?reset_running_requests=true") > 3  # retried first
    err = capsys.readouterr().err
    assert "preempted" in err and "http://127.0.0.1:1" in err
    engine._reset_prefix_cache()
    assert "preempted" not in capsys.readouterr().err  # said once
    forced_ok["value"] = False
    with pytest.raises(RuntimeError, match="the prefix cache could not be dropped"):
        engine._reset_prefix_cache()


def test_the_in_process_engines_reset_is_checked_too():
    from rlvr.rollout.weight_sync import reset_prefix_cache

    answers = iter([False, True])
    reset_prefix_cache(lambda: next(answers), "vLLM engine", wait_s=0)
    with pytest.raises(RuntimeError, match="vLLM engine: the prefix cache"):
        reset_prefix_cache(lambda: False, "vLLM engine", wait_s=0)


@pytest.mark.parametrize("paused", [False, True])
def test_a_reset_answer_that_does_not_say_success_is_named_at_once(monkeypatch, paused):
    """A vLLM whose ``/reset_prefix_cache`` answers an empty 200 (no ``success``: an older
    server Python, ``rollout.server_python``) was read as a refusal: 20 retries over 9 s, then
    "blocks still held", which sends the user hunting for running requests."""

    calls = []

    def post(url, path, body, **kw):
        if path.startswith("/reset_prefix_cache"):
            calls.append(path)
        return {}

    engine = _engine_over(monkeypatch, post)
    engine._paused = paused
    with pytest.raises(RuntimeError, match=r"answered \{\}, not vLLM's"):
        engine._reset_prefix_cache()
    assert len(calls) == 1
