"""Start both workers, let them take turns block by block, and collect their step records."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness.machine import PeakRss
from benchmarks.harness.protocol import parse_event
from benchmarks.harness.stats import time_to_target

REPO = Path(__file__).resolve().parents[2]


class WorkerFailed(RuntimeError):
    """A worker exited or timed out; the message points at its log."""


@dataclass
class Worker:
    """One side's worker process: its events, step records and peak memory."""

    side: str
    argv: list[str]
    env: dict
    log_path: Path
    steps: list[dict] = field(default_factory=list)
    ready: dict = field(default_factory=dict)
    done: dict = field(default_factory=dict)
    finished: bool = False  # told to stop (or ran out of steps)

    def start(self) -> Worker:
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
            env=self.env,
            cwd=REPO,
        )
        self._events: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.rss = PeakRss(self.proc.pid).start()
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                event = parse_event(line.rstrip("\n"))
            except ValueError as exc:
                event = {"event": "bad_line", "error": str(exc)}
            if event is None:
                self._log.write(line)
                self._log.flush()
            else:
                self._events.put(event)
        self._events.put({"event": "exit"})

    def _wait_for(self, kind: str, timeout_s: float) -> dict:
        while True:
            try:
                event = self._events.get(timeout=timeout_s)
            except queue.Empty:
                raise WorkerFailed(
                    f"{self.side} worker sent nothing for {timeout_s:.0f} s while waiting for "
                    f"'{kind}'; see {self.log_path}"
                ) from None
            if event["event"] == "step":
                self.steps.append({k: v for k, v in event.items() if k != "event"})
            elif event["event"] == "done":
                self.done = event
                self.finished = True
            elif event["event"] in ("exit", "bad_line"):
                code = self.proc.wait()
                detail = event.get("error", f"exit code {code}")
                raise WorkerFailed(
                    f"{self.side} worker ended while waiting for '{kind}' ({detail}); "
                    f"last lines of {self.log_path}:\n{_tail(self.log_path)}"
                )
            if event["event"] == kind or (event["event"] == "done" and kind == "paused"):
                return event

    def _send(self, cmd: dict) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def wait_ready(self, timeout_s: float) -> dict:
        event = self._wait_for("ready", timeout_s)
        self.ready = {k: v for k, v in event.items() if k != "event"}
        return self.ready

    def run_block(self, steps: int, timeout_s: float) -> None:
        self._send({"cmd": "run", "steps": steps})
        self._wait_for("paused", timeout_s)

    def close(self, timeout_s: float = 120.0) -> None:
        """Tell the worker to stop (if it still runs), wait for it, stop the memory sampler."""
        try:
            if self.proc.poll() is None and not self.done:
                self._send({"cmd": "stop"})
                self._wait_for("done", timeout_s)
            self.proc.wait(timeout=timeout_s)
        except (WorkerFailed, BrokenPipeError, subprocess.TimeoutExpired):
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        finally:
            self.finished = True
            self.rss.stop()
            self._log.close()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def worker_env(threads: int, pythonpath: list[Path]) -> dict:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(str(p) for p in pythonpath),
    )
    env.pop("VIRTUAL_ENV", None)
    return env


def block_order(sides: list[str], round_index: int) -> list[str]:
    """ABBA order: who goes first swaps every round, so neither side always follows the other."""
    return list(sides) if round_index % 2 == 0 else list(reversed(sides))


def alternate(
    workers: dict[str, Worker],
    *,
    steps: int,
    block: int,
    target: float | None,
    window: int,
    block_timeout_s: float,
    log=print,
) -> None:
    """Run every worker to ``steps`` steps in turns of ``block`` steps.

    With a ``target``, a side stops as soon as its rolling mean reward reaches it.
    """
    sides = list(workers)
    round_index = 0
    while True:
        active = [s for s in sides if not workers[s].finished and len(workers[s].steps) < steps]
        if not active:
            return
        for side in block_order(sides, round_index):
            w = workers[side]
            if side not in active:
                continue
            k = min(block, steps - len(w.steps))
            w.run_block(k, block_timeout_s)
            last = w.steps[-1] if w.steps else {}
            log(
                f"[bench] {side}: step {len(w.steps)}/{steps}, last step {last.get('wall_s', 0):.1f} s, "
                f"reward {last.get('reward_mean', 0):.2f}"
            )
            hit = time_to_target(w.steps, target, window) if target is not None else None
            if hit is not None:
                # the block runs to its end: the side stops a few steps after the hit
                log(
                    f"[bench] {side} reached the target reward at step {hit['step']} "
                    f"(stopped after step {len(w.steps)}, the end of its block)"
                )
                w.close()
        round_index += 1
