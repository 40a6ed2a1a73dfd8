"""The rollout server's shared secret: an ASGI middleware vLLM's OpenAI server loads
(``--middleware rlvr.rollout.server_auth.RequireToken``) that refuses every request without the
run's token in its ``X-Rlvr-Token`` header, ``GET /health`` alone excepted (the start-up check).

Why: the server runs with vLLM's development endpoints on (``VLLM_SERVER_DEV_MODE=1``), and
``POST /collective_rpc`` calls any worker method by name, rlvr's weight-sync join
(`rlvr.rollout.server_worker`) included; ``/update_weights``, ``/sleep``, ``/pause`` and the
others change the engine too. vLLM's own ``--api-key`` guards only ``/v1``, ``/v2``,
``/inference`` and ``/cohere``. So whoever reached the port could push weights into the engine or
drive its workers.

The token travels in the environment (``TOKEN_ENV``), never on a command line that ``ps`` shows:
`rlvr.rollout.server_launch` generates one per server it starts and hands it to the server's
process and to the trainer's client; ``rlvr rollout-server`` takes it from ``TOKEN_ENV`` or
writes a new one to a file only its user can read (``write_token_file``). Standard library only:
the server's Python imports this module by name.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
from pathlib import Path

TOKEN_ENV = "RLVR_ROLLOUT_TOKEN"
HEADER = "X-Rlvr-Token"
OPEN = {("GET", "/health"), ("HEAD", "/health")}  # the start-up check, nothing else


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_from_env() -> str | None:
    return os.environ.get(TOKEN_ENV) or None


def headers(token: str | None) -> dict[str, str]:
    """The header a request to a server guarded by ``token`` carries."""
    return {HEADER: token} if token else {}


def write_token_file(path: Path, token: str) -> Path:
    """``token`` in ``path``, readable and writable by this user alone (0600 from creation)."""
    path = Path(path)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return path


class RequireToken:
    """ASGI middleware: a request without the token (``TOKEN_ENV`` of the server's process) gets
    401 and reaches nothing behind it; a websocket is closed (policy violation)."""

    def __init__(self, app) -> None:
        token = token_from_env()
        if not token:
            raise RuntimeError(f"{TOKEN_ENV} is not set: the rollout server would be open to all")
        self.app = app
        self._token = token.encode()
        self._header = HEADER.lower().encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            return await self.app(scope, receive, send)
        if (scope.get("method"), scope.get("path")) in OPEN:
            return await self.app(scope, receive, send)
        given = b""
        for name, value in scope.get("headers", []):
            if name == self._header:
                given = value
        if hmac.compare_digest(given, self._token):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return None
        body = json.dumps({"error": f"the rollout server needs its token ({HEADER} header)"})
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body.encode()})
        return None
