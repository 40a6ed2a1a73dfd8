"""``rollout.max_staleness=1``: the batch of step t+1 is generated from the policy before update t.

``Lookahead`` holds that batch between steps. The step asks it to ``start`` the next batch after
scoring the current one and before its update, and ``take``s it at the start of the next step:

- an engine in this process (hf, colocated vLLM) generates at once, in the calling thread. One
  device and one process leave nothing to overlap with; a thread would only contend for the same
  cores (and the hf engine would read the very weights the update writes), and generating in
  order keeps the run deterministic (same seeds, same RNG order).
- an engine in another process (``rollout.mode=server``, ``engine.remote = True``) generates in a
  background thread that only waits on the worker's HTTP reply, so generation t+1 runs on the
  worker while update t runs here. The request (seeds, prompt rows, sampler position) is drawn in
  the main thread before the thread starts, so the thread touches no global RNG or counter.

A weight sync must not land in the middle of a generation: ``wait()`` (the step calls it before
syncing) blocks until the pending batch has arrived. Every completion carries the policy version
that sampled it; ``staleness_stats`` logs trained version minus that.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from rlvr.objectives.batch import RolloutBatch
from rlvr.rollout.base import Completion


class Lookahead:
    """The batch generated one step ahead.

    ``request(step)`` runs in the caller's thread and returns a zero-argument function that
    generates step ``step``'s batch (``Step.request``); ``background`` runs that function in a
    worker thread.
    """

    def __init__(self, request: Callable[[int], Callable[[], RolloutBatch]], background: bool):
        self._request = request
        self._pool = (
            ThreadPoolExecutor(1, thread_name_prefix="rlvr-lookahead") if background else None
        )
        self._step: int | None = None
        self._future: Future | None = None
        self._batch: RolloutBatch | None = None
        self.seconds = 0.0  # wall time of the last batch's generation (in the thread if background)
        self.taken = False  # whether the last take() returned a batch generated ahead

    def start(self, step: int) -> None:
        """Generate the batch of step ``step`` (0-based: the ``state.step`` it will run at)."""
        if self._step is not None:
            raise RuntimeError(f"a batch for step {self._step} is already ahead")
        generate = self._request(step)
        self._step = step
        if self._pool is None:
            self._batch = self._timed(generate)
        else:
            self._future = self._pool.submit(self._timed, generate)

    def advance(self, step: int, max_steps: int, metrics: dict, times: dict, timed) -> None:
        """After scoring step ``step``'s batch: log its generation time (``time_generate``,
        wherever and whenever it ran) and start the next step's batch (``timed`` counts the
        trainer's share into ``time_rollout``), unless this is the last step."""
        metrics["time_generate"] = self.seconds if self.taken else times["time_rollout"]
        if step + 1 < max_steps:
            timed("time_rollout", self.start, step + 1)

    def _timed(self, generate: Callable[[], RolloutBatch]) -> RolloutBatch:
        t = time.perf_counter()
        batch = generate()
        self.seconds = time.perf_counter() - t
        return batch

    def wait(self) -> float:
        """Block until the pending batch (if any) has arrived; returns the seconds waited."""
        if self._future is None:
            return 0.0
        t = time.perf_counter()
        future, self._future = self._future, None
        self._batch = future.result()  # a failed generation raises here, in the trainer
        return time.perf_counter() - t

    def take(self, step: int) -> RolloutBatch | None:
        """The batch generated ahead for ``step`` (waiting for it), or None when there is none."""
        self.taken = False
        if self._step is None:
            return None
        if self._step != step:
            raise RuntimeError(f"the batch ahead is for step {self._step}, not step {step}")
        self.wait()
        batch, self._batch, self._step = self._batch, None, None
        self.taken = True
        return batch

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """The batch ahead (JSON-able), so a resumed run trains on what it generated before."""
        self.wait()
        if self._step is None:
            return {}
        b = self._batch
        return {
            "step": self._step,
            "rows": b.rows,
            "prompt_texts": b.prompt_texts,
            "prompt_ids": b.prompt_ids,
            "groups": [[dataclasses.asdict(c) for c in grp] for grp in b.groups],
            "group_size": b.group_size,
        }

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        groups = [[Completion(**c) for c in grp] for grp in state["groups"]]
        self._batch = RolloutBatch(
            state["rows"], state["prompt_texts"], state["prompt_ids"], groups, state["group_size"]
        )
        self._step = int(state["step"])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def stamp_version(groups: list[list[Completion]], version: int) -> None:
    """Label completions the engine did not label with the version that sampled them."""
    for grp in groups:
        for c in grp:
            if c.policy_version is None:
                c.policy_version = version


def staleness_stats(completions: list[Completion], trained_version: int) -> dict[str, float]:
    """``staleness_mean``/``_max``: the version being trained minus each completion's version."""
    lags = [trained_version - c.policy_version for c in completions if c.policy_version is not None]
    if not lags:
        return {}
    return {"staleness_mean": sum(lags) / len(lags), "staleness_max": float(max(lags))}
