"""The probe a backend passes before `get_sandbox` hands it out: a real run of a tiny program
that tries what the sandbox must stop, with the trainer checking each result from outside."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile

from rlvr.sandbox.base import Limits, Sandbox

PROGRAM = r"""
import json, os, socket, sys
secret, port, parent, marker = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
out = {"uid": os.getuid(), "cwd_write": False}
try:
    os.setgroups([])  # needs CAP_SETGID: a program with capabilities could undo its limits
    out["caps"] = True
except OSError:
    out["caps"] = False
try:
    out["secret"] = open(secret).read()
except OSError:
    out["secret"] = None
try:
    socket.create_connection(("127.0.0.1", port), timeout=1).close()
    out["connected"] = True
except OSError:
    out["connected"] = False
try:
    os.kill(parent, 0)
    out["signal"] = True
except OSError:
    out["signal"] = False
try:
    open(marker, "w").write("x")
except OSError:
    pass
open("probe.txt", "w").write("ok")
out["cwd_write"] = open("probe.txt").read() == "ok"
out["env"] = sorted(os.environ)
print(json.dumps(out))
"""


def check_isolation(box: Sandbox) -> str | None:
    """None when ``box`` holds: it cannot read a file of the trainer's, connect to a listener
    on the trainer's 127.0.0.1, signal the trainer, write outside its folder, or see the
    trainer's environment; else what failed."""
    folder = tempfile.mkdtemp(prefix="rlvr-probe-")
    os.chmod(folder, 0o755)
    secret = os.path.join(folder, "secret")
    with open(secret, "w") as f:
        f.write("rlvr-probe-secret")
    os.chmod(secret, 0o644)
    marker = os.path.join(folder, "escaped")
    listener = socket.socket()
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        os.environ.setdefault("RLVR_SANDBOX_PROBE", "1")
        r = box.run(
            ["python3", "probe.py", secret, str(port), str(os.getpid()), marker],
            files={"probe.py": PROGRAM},
            limits=Limits(wall_s=30, cpu_s=30),
        )
        if r.returncode != 0:
            return f"the probe program failed (exit {r.returncode}, limit {r.limit}): {r.stderr[-400:]}"
        got = json.loads(r.stdout)
        bad = []
        if got["secret"] is not None:
            bad.append("it read a file of the trainer's")
        if got["connected"]:
            bad.append("it connected to the trainer's 127.0.0.1")
        if got["signal"]:
            bad.append("it could signal the trainer")
        if os.path.exists(marker):
            bad.append("it wrote outside its folder")
        if "RLVR_SANDBOX_PROBE" in got["env"]:
            bad.append("it saw the trainer's environment")
        if got["caps"]:
            bad.append("it holds capabilities (root)")
        if not got["cwd_write"]:
            bad.append("it could not write its own folder")
        return "; ".join(bad) or None
    except (OSError, ValueError, KeyError) as exc:
        return f"the probe failed: {type(exc).__name__}: {exc}"
    finally:
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)
