"""A process that imports torch, transformers and rlvr once, then forks one child per run.

Killing a run and starting it again a dozen times would spend most of its time importing
(4-6 s per ``python -m rlvr`` here); a forked child starts training at once. Each child is a real,
separate process running ``rlvr.cli.main(argv)``: a test can SIGKILL it, limit it (prlimit), or
send it SIGINT. The server itself does no computation before forking, so no thread pool is
copied into a child half-initialised.

Protocol: one JSON object per line on stdin, one reply per line on stdout.

    {"op": "run", "argv": [...], "env": {...}, "log": path, "hooks": "module:function" | null,
     "new_group": bool}                       -> {"pid": N}
    {"op": "wait", "pid": N}                  -> {"pid": N, "code": exit code or -signal}
    {"op": "quit"}                            -> (exits)

``hooks`` names a function the child calls before ``main`` (to install test probes);
``new_group`` puts the child in its own process group (what a terminal's Ctrl-C reaches).

``ForkServer`` is the test side: start, ``run``, ``wait``, ``close``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path


def _child(cmd: dict) -> None:
    """Runs in the forked child; never returns."""
    code = 1
    try:
        if cmd.get("new_group"):
            os.setpgid(0, 0)
        log = os.open(cmd["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.environ.update(cmd.get("env") or {})
        import sitecustomize  # tests/sitecustomize.py: the test hooks this child's env asks for

        sitecustomize.install()
        # A run started from a terminal takes Ctrl-C; the server may have been started with
        # SIGINT ignored (a background job, nohup), which its children would inherit.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if cmd.get("hooks"):
            from rlvr.rewards.sandbox import resolve_target

            resolve_target(cmd["hooks"])()
        from rlvr.cli.main import main

        code = main(cmd["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the child reports everything through its exit code
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _serve() -> None:
    import torch

    torch.set_num_threads(1)
    # Import what a run would otherwise import lazily, so children share it.
    from transformers import AutoModelForCausalLM, LlamaForCausalLM  # noqa: F401

    import rlvr.checkpoint.full  # noqa: F401
    import rlvr.cli.main  # noqa: F401
    import rlvr.training.trainer  # noqa: F401
    from rlvr.rollout.hf import HFEngine  # noqa: F401
    from rlvr.training.tiny import build_char_tokenizer  # noqa: F401

    out = sys.stdout
    out.write(json.dumps({"ready": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "run":
            out.flush()
            pid = os.fork()
            if pid == 0:
                _child(cmd)
            reply = {"pid": pid}
        elif cmd["op"] == "wait":
            _, status = os.waitpid(cmd["pid"], 0)
            reply = {"pid": cmd["pid"], "code": os.waitstatus_to_exitcode(status)}
        elif cmd["op"] == "quit":
            return
        else:
            reply = {"error": f"unknown op {cmd['op']!r}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


class ForkServer:
    """The test side of the protocol above; use as a context manager."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reliability.forkserver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self._read()
        if "ready" not in ready:
            raise RuntimeError(f"fork server did not start: {ready}")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"fork server exited with code {self.proc.wait()}")
        return json.loads(line)

    def _ask(self, cmd: dict) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def run(
        self,
        argv: list[str],
        log: Path,
        *,
        env: dict[str, str] | None = None,
        hooks: str | None = None,
        new_group: bool = False,
    ) -> int:
        """Fork a child running ``rlvr <argv>``; returns its pid."""
        cmd = {"op": "run", "argv": argv, "env": env or {}, "log": str(log), "hooks": hooks,
               "new_group": new_group}  # fmt: skip
        return self._ask(cmd)["pid"]

    def wait(self, pid: int) -> int:
        """Reap child ``pid``; its exit code, or minus the signal that killed it."""
        return self._ask({"op": "wait", "pid": pid})["code"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.flush()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    _serve()
