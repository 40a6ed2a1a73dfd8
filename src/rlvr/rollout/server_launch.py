"""Starting a rollout server: vLLM's own OpenAI-compatible server (``vllm.entrypoints.openai.
api_server``) with rlvr's weight receiver as its worker extension, the dev endpoints on
(``/collective_rpc``, ``/update_weight_version``, ``/reset_prefix_cache``) and the token-in
token-out endpoint ``/inference/v1/generate``.

``server_command`` is the one command line both launch paths use: ``rlvr train`` with
``rollout.mode=server`` and no ``rollout.server_url`` (a child process, stopped with the run), and
``rlvr rollout-server`` (standalone, in the foreground; it outlives trainer restarts).
No vLLM import here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import torch

from rlvr.model.loading import resolve_model_path
from rlvr.rollout.adapter_sync import max_lora_rank
from rlvr.rollout.server_auth import TOKEN_ENV, new_token, token_from_env, write_token_file
from rlvr.rollout.server_auth import headers as auth_headers
from rlvr.rollout.vllm_setup import (
    CPU_KV_BLOCK,
    DTYPE_NAMES,
    cpu_kv_cache_bytes,
    engine_dtype,
    max_model_len_for,
    max_num_seqs_for,
    read_config,
    total_memory,
)

WORKER_EXTENSION = "rlvr.rollout.server_worker.WeightReceiver"
MIDDLEWARE = "rlvr.rollout.server_auth.RequireToken"


# ---------------------------------------------------------------------- HTTP (stdlib only)
# ---------------------------------------------------------------------- HTTP (stdlib only)
def _call(
    url: str, path: str, body: dict | None, timeout_s: float | None, token: str | None
) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url + path,
        data=data,
        headers={"Content-Type": "application/json", **auth_headers(token)},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:2000]
        if exc.code == 401:
            detail += (
                f"; give the trainer the server's token in {TOKEN_ENV} (`rlvr rollout-server` "
                "prints the file it wrote it to)"
            )
        raise RuntimeError(f"rollout server {url}{path}: HTTP {exc.code}: {detail}") from exc
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConnectionError(
            f"rollout server at {url} is not reachable ({path}: {reason}); start it with "
            "`rlvr rollout-server --config RUN.yaml` or check rollout.server_url"
        ) from exc
    try:
        return json.loads(raw) if raw else {}
    except ValueError:  # a plain-text answer (vLLM's /v1/load_lora_adapter)
        return {"text": raw.decode(errors="replace")}


def http_get(
    url: str, path: str, *, timeout_s: float | None = 30, token: str | None = None
) -> dict:
    return _call(url, path, None, timeout_s, token)


def http_post(
    url: str, path: str, body: dict, *, timeout_s: float | None = None, token: str | None = None
) -> dict:
    return _call(url, path, body, timeout_s, token)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port_free(host: str, port: int) -> None:
    """A port in use would let the health check reach some other server, not the one started.

    Bound with SO_REUSEADDR, as the server itself binds (vLLM's api_server, uvicorn): a port
    whose only sockets are a previous run's connections in TIME_WAIT is free to it, while a
    port another socket listens on is still refused (Linux shares no listening port)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ValueError(
                f"rollout.server_port={port} is in use on {host} ({exc.strerror}); if a rollout "
                f"server runs there, set rollout.server_url=http://{host}:{port}, else pick "
                "another port"
            ) from exc


def server_command(
    cfg, model_dir: str | Path, dtype: torch.dtype, *, host: str = "127.0.0.1", port: int
) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server ...`` for ``model_dir`` with the run's
    rollout knobs: the sampler's processed log-probs, no generation defaults from the folder, the
    engine dtype, and on a CPU an explicit KV-cache size (``cpu_kv_cache_bytes``) and rlvr's
    KV-cache block size (``CPU_KV_BLOCK``)."""
    r = cfg.rollout
    python = r.server_python or sys.executable
    cmd = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        DTYPE_NAMES[dtype],
        "--seed",
        str(cfg.train.seed),
        "--max-model-len",
        str(max_model_len_for(cfg)),
        "--max-num-seqs",
        str(max_num_seqs_for(cfg)),
        "--tensor-parallel-size",
        str(r.tensor_parallel_size),
        "--logprobs-mode",
        "processed_logprobs",
        "--generation-config",
        "vllm",
        "--worker-extension-cls",
        WORKER_EXTENSION,
        "--middleware",
        MIDDLEWARE,  # every request but GET /health needs the run's token (server_auth)
        "--enable-scale-out",
        "--disable-log-stats",
    ]
    if r.enforce_eager:
        cmd.append("--enforce-eager")
    if cfg.model.lora.enabled and r.lora_sync != "merged":  # adapter-only sync may serve LoRA
        cmd += ["--enable-lora", "--max-loras", "1"]
        cmd += ["--max-lora-rank", str(max_lora_rank(cfg.model.lora.rank))]
    if not torch.cuda.is_available():
        kv = cpu_kv_cache_bytes(
            read_config(str(model_dir)),
            dtype,
            max_model_len=max_model_len_for(cfg),
            max_num_seqs=max_num_seqs_for(cfg),
            memory_fraction=r.gpu_memory_utilization,
            total_memory=total_memory(),
        )
        cmd += ["--kv-cache-memory-bytes", str(kv), "--block-size", str(CPU_KV_BLOCK)]
    else:
        cmd += ["--gpu-memory-utilization", str(r.gpu_memory_utilization)]
    return cmd


def server_env(token: str) -> dict[str, str]:
    """The server's environment: dev endpoints on, guarded by ``token`` (`server_auth`), rlvr
    importable by the worker extension and the middleware."""
    env = dict(os.environ)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env[TOKEN_ENV] = token
    env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # /v1/load_lora_adapter (adapter-only sync)
    src = str(Path(__file__).resolve().parents[2])  # the folder holding the rlvr package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return env


def _die_with_parent() -> None:
    """Linux: SIGTERM the server when the trainer that started it dies, even by SIGKILL."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_server(cmd: list[str], log_path: Path, token: str) -> subprocess.Popen:
    """The server as a child process in its own session (stopped with ``stop_server``, and on
    Linux when the trainer dies), guarded by ``token``."""
    log = open(log_path, "ab")  # noqa: SIM115 - the child writes to it until it exits
    try:
        return subprocess.Popen(
            cmd,
            env=server_env(token),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
    finally:
        log.close()


def wait_healthy(url: str, proc: subprocess.Popen | None, timeout_s: float, log: Path | None):
    """Block until ``url``/health answers; a server process that exits first is an error with
    the tail of its log."""

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log is not None else ""
            raise RuntimeError(
                f"the rollout server for {url} exited with code {proc.returncode} during "
                f"start-up; its log ({log}) ends with:\n{tail}"
            )
        try:
            http_get(url, "/health", timeout_s=5)
            return
        except ConnectionError:
            time.sleep(1.0)
    raise TimeoutError(f"the rollout server at {url} did not answer /health in {timeout_s} s")


def stop_server(proc: subprocess.Popen, timeout_s: float = 30) -> None:
    """SIGTERM the server's process group (the API server and the engine process it started),
    SIGKILL if it hangs."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout_s)


def serve_forever(
    cfg, *, port: int | None = None, host: str = "127.0.0.1", token_file: Path | None = None
) -> int:
    """``rlvr rollout-server``: run the server for ``cfg``'s model in the foreground (this
    process becomes vLLM's server). Trainers connect with ``rollout.server_url`` and push their
    weights on connecting, so the server outlives trainer restarts (``rlvr train --resume``).

    Every request but ``GET /health`` needs the token (`server_auth`): ``RLVR_ROLLOUT_TOKEN``
    if set, else a new one written to ``token_file`` (default ``rollout-server-PORT.token``
    here), readable by this user alone, for trainers to read into their own environment."""

    device = "cuda" if torch.cuda.is_available() else "cpu"
    folder = resolve_model_path(cfg.model.name_or_path)
    port = port or cfg.rollout.server_port
    cmd = server_command(cfg, folder, engine_dtype(cfg, device), host=host, port=port)
    token = token_from_env()
    if token is None:
        token = new_token()
        path = write_token_file(token_file or Path(f"rollout-server-{port}.token"), token)
        print(
            f"[rlvr] rollout server token: {path.resolve()} (mode 0600); trainers connect with "
            f"{TOKEN_ENV}=$(cat {path.resolve()})",
            flush=True,
        )
    print(f"[rlvr] rollout server: {' '.join(cmd)}", flush=True)
    os.execvpe(cmd[0], cmd, server_env(token))
    return 0  # not reached
