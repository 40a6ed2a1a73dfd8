"""``rollout.max_staleness=k`` (0 to 4): the batches of the next k steps are requested ahead.

``Lookahead`` holds them between steps. The pipeline (versions count updates; with every update
synced, the engine holds version s while step s runs):

- step 0 generates its batch at once; after scoring a batch of step s, and before update s, the
  step requests every batch up to step s + k (steps 1..k at step 0, then step s + k);
- a request draws its prompts, seeds and sampler position in the trainer's thread, in step
  order; the batch is sampled by the weights the engine holds when its generation starts, never
  older than those it held at the request. So the batch of step s + k, requested while step s
  runs, comes from version >= s: at most k versions behind the version that trains on it;
- the trainer takes batches in step order (``take``). A batch with a completion more than k
  versions behind the trained version (the engine lags when ``rollout.sync_every`` > 1 skips
  pushes, or a server labels older weights) is dropped, counted (``stale_dropped`` batches,
  ``stale_dropped_seqs`` sequences) and regenerated at once from the same prompts and seeds after
  pushing the current weights (``resample``): the step still trains one batch of its own
  prompts, so the step count, the data order and a resume stay those of the run.

Where the batches ahead are generated:

- an engine in this process (hf, colocated vLLM) generates each at its request, in the calling
  thread. One device and one process leave nothing to overlap with; a thread would only contend
  for the same cores (and the hf engine would read the very weights the update writes), and
  generating in order keeps the run deterministic (same seeds, same RNG order). With k > 1 this
  reproduces the lag of a k-deep pipeline exactly (version s samples step s + k), at no gain in
  speed: a way to study staleness reproducibly;
- an engine in another process (``rollout.mode=server``, ``engine.remote = True``) generates in
  one background thread that only waits on the worker's HTTP replies, the requests in step
  order. A ``_Gate`` keeps weight syncs and generations apart: a sync waits for the generation in
  flight (``time_wait_ahead``), and generations queued behind it wait for the sync, so they start
  on the new weights.

Every completion carries the policy version that sampled it (the server's label, else
``stamp_version``); ``staleness_stats`` logs trained version minus that.

Partial rollouts (``rollout.partial``, server mode): a push does not wait for the generation in
flight. ``guard`` still holds back the generations queued behind the push, but around the push
it holds the engine's ``paused()`` instead of waiting: the worker freezes its requests, takes the
new weights and version label, and continues them on the new weights, so a completion may carry
several versions, one per token (``Completion.token_versions``), each token with the engine
log-prob of the weights that sampled it (what the rollout correction reads). ``staleness_stats``
adds the lag per token (``token_lag_mean``/``_max``). A checkpoint waits for the generations in
flight as before: they finish on the weights they hold, and the checkpoint holds whole batches
with their per-token versions, so a resume trains on exactly them.

The loss treats a batch ahead as decoupled PPO does (arXiv 2505.24298): the proximal policy the
ratio is clipped around is the trainer's current weights (the step's old-log-prob pass), and the
behaviour policy, the engine's log-probs on each completion, enters only through the rollout
correction (``algo.rollout_correction`` / ``algo.tis_cap``); nothing in the objective depends on k.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import io
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from rlvr.data.multimodal import PromptVision
from rlvr.objectives.batch import RolloutBatch
from rlvr.rollout.base import Completion, EpisodeInfo
from rlvr.training.state import TrainState


def sync_engine(
    engine,
    state: TrainState,
    weights: Callable[[], Iterator],
    *,
    every: int = 1,
    guard: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> dict | None:
    """Give ``engine`` the state's weights when it holds an older policy version.

    ``every`` > 1 lets generation run on weights up to ``every - 1`` updates old
    (``rollout.sync_every``); evaluation and restore call it with 1. An engine that samples from
    the trainer's own module (``shares_weights``) is always current. ``guard`` is held around a
    push (``Lookahead.guard``: no generation runs ahead meanwhile). Returns the engine's sync
    statistics, or None when nothing was pushed."""
    if getattr(engine, "shares_weights", False):
        engine.policy_version = state.policy_version
        return None
    lag = state.policy_version - engine.policy_version
    if lag == 0 or (0 < lag < every):
        return None
    with guard():
        engine.load_weights(weights())
        engine.policy_version = state.policy_version
    stats = getattr(engine, "last_sync_stats", None)  # the vLLM engine's SyncStats
    return dataclasses.asdict(stats) if stats is not None else {}


class _Gate:
    """Generations (the worker thread) and weight syncs (the trainer's thread) never overlap; a
    sync that waits goes before the next queued generation (else a fast worker could keep the
    trainer's weights from ever reaching the engine while its queue is full)."""

    def __init__(self, pause: Callable[[], contextlib.AbstractContextManager] | None = None):
        """``pause``: the engine's ``paused()`` (partial rollouts): a sync holds it instead of
        waiting for the generation in flight."""
        self._cond = threading.Condition()
        self._generating = False
        self._syncing = False
        self._pause = pause
        self.waited = 0.0  # seconds syncs waited for a generation in flight (or the pause)

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._syncing)
            self._generating = True
        try:
            yield
        finally:
            with self._cond:
                self._generating = False
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        t = time.perf_counter()
        with self._cond:
            self._syncing = True
            if self._pause is None:
                self._cond.wait_for(lambda: not self._generating)
        try:
            with self._pause() if self._pause is not None else contextlib.nullcontext():
                self.waited += time.perf_counter() - t
                yield
        finally:
            with self._cond:
                self._syncing = False
                self._cond.notify_all()


@dataclasses.dataclass
class _Ahead:
    step: int
    future: Future | None = None  # background: the generation queued or running
    batch: RolloutBatch | None = None
    seconds: float = 0.0  # wall time of its generation (in the thread if background)
    sampler: dict | None = None  # the prompt sampler's state before this batch's prompts
    pinned: bool = False  # other prompts were drawn after it: a stop must wait for it

    @property
    def finished(self) -> bool:
        return self.future is None or self.future.done()

    def result(self) -> RolloutBatch:
        if self.future is not None:
            future, self.future = self.future, None
            self.batch = future.result()  # a failed generation raises here, in the trainer
        return self.batch


class Lookahead:
    """The batches generated up to ``depth`` steps ahead (module docstring): a queue the step
    (`rlvr.training.step.Step`) drives, calling into nothing of it.

    ``start(step, generate, sampler)`` queues one batch: ``generate`` (``Step.request``'s
    zero-argument function) runs in the caller's thread, or in a worker thread when
    ``background``; ``take(step)`` hands the step its batch, and ``replaced`` records that the
    step generated it again as too stale (``too_stale``). ``pause`` (the engine's ``paused()``,
    background only) makes pushes partial (module docstring); ``abort`` (the engine's
    ``abort_generations``) ends a generation still running at ``close``."""

    def __init__(
        self,
        depth: int,
        background: bool,
        pause: Callable[[], contextlib.AbstractContextManager] | None = None,
        abort: Callable[[], None] | None = None,
    ):
        self.depth = depth
        self._abort = abort if background else None
        self._pool = (
            ThreadPoolExecutor(1, thread_name_prefix="rlvr-lookahead") if background else None
        )
        self._gate = _Gate(pause) if background else None
        self._queue: deque[_Ahead] = deque()
        self._next: int | None = None  # the next step to request (None: none requested yet)
        self._taken: _Ahead | None = None  # the entry the last take() returned
        self.dropped = (0, 0)  # (batches, sequences) the last take() dropped as too stale

    def guard(self) -> contextlib.AbstractContextManager:
        """Held around a weight push: waits for the generation in flight, holds back the queue."""
        return self._gate.exclusive() if self._gate is not None else contextlib.nullcontext()

    def waited(self) -> float:
        """Seconds weight pushes waited for a generation since the last call."""
        if self._gate is None:
            return 0.0
        out, self._gate.waited = self._gate.waited, 0.0
        return out

    def start(
        self, step: int, generate: Callable[[], RolloutBatch], sampler: dict | None = None
    ) -> None:
        """Queue the batch of step ``step`` (0-based: the ``state.step`` it will run at), whose
        prompts ``generate`` holds; ``sampler``: the prompt sampler's state before they were
        drawn (a stop that drops this batch rewinds the sampler to it)."""
        if self._next is not None and step != self._next:
            raise RuntimeError(f"the next batch to request is step {self._next}'s, not {step}'s")
        entry = _Ahead(step, sampler=sampler)
        self._next = step + 1
        if self._pool is None:
            entry.batch = self._timed(entry, generate)
        else:
            entry.future = self._pool.submit(self._background, entry, generate)
        self._queue.append(entry)

    def to_request(self, step: int, max_steps: int) -> range:
        """After scoring step ``step``'s batch: the steps whose batches to request now, every one
        up to step ``step + depth`` (none past the run's last step)."""
        first = step + 1 if self._next is None else self._next
        return range(first, min(step + self.depth, max_steps - 1) + 1)

    def log(self, metrics: dict, times: dict) -> None:
        """The taken batch's generation time (``time_generate``, wherever and whenever it ran)
        and the batches dropped as too stale."""
        taken = self._taken
        metrics["time_generate"] = taken.seconds if taken is not None else times["time_rollout"]
        metrics["stale_dropped"], metrics["stale_dropped_seqs"] = map(float, self.dropped)

    def pin(self) -> None:
        """Prompts were drawn for something else (a dynamic-sampling round): the sampler cannot
        be rewound past the batches queued so far, so a stop keeps them all."""
        for entry in self._queue:
            entry.pinned = True

    def _timed(self, entry: _Ahead, generate: Callable[[], RolloutBatch]) -> RolloutBatch:
        t = time.perf_counter()
        batch = generate()
        entry.seconds = time.perf_counter() - t
        return batch

    def _background(self, entry: _Ahead, generate: Callable[[], RolloutBatch]) -> RolloutBatch:
        with self._gate.generating():
            return self._timed(entry, generate)

    def take(self, step: int) -> RolloutBatch | None:
        """The batch generated ahead for ``step`` (waiting for it), or None when there is none."""
        self._taken, self.dropped = None, (0, 0)
        if not self._queue:
            return None
        if self._queue[0].step != step:
            raise RuntimeError(f"the batch ahead is for step {self._queue[0].step}, not {step}")
        self._taken = self._queue.popleft()
        return self._taken.result()

    def too_stale(self, batch: RolloutBatch, trained_version: int) -> bool:
        """A completion more than ``depth`` versions behind ``trained_version``."""
        versions = [c.policy_version for c in batch.completions if c.policy_version is not None]
        return bool(versions) and trained_version - min(versions) > self.depth

    def replaced(self, batch: RolloutBatch, seconds: float) -> None:
        """The taken batch was dropped as too stale and generated again (``batch``, in
        ``seconds``): counted in the step's ``stale_dropped``."""
        entry = self._taken
        self.dropped = (1, len(entry.batch.completions))
        entry.batch, entry.seconds = batch, seconds

    def wait(self) -> None:
        """Block until every batch requested has arrived."""
        for entry in self._queue:
            entry.result()

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self, *, finished_only: bool = False) -> tuple[dict, dict | None]:
        """The batches ahead (JSON-able), so a resumed run trains on what it generated before;
        and the prompt sampler's state to save instead of the current one (None: the current).

        ``finished_only`` (a stop signal's checkpoint, which must not wait for generations):
        the batches finished so far, in step order up to the first unfinished one; the others
        are dropped, and the sampler state returned is the one from before the first dropped
        batch's prompts were drawn, so the resumed run draws them again with the same seeds."""
        kept: list[_Ahead] = []
        for entry in self._queue:
            if finished_only and not (entry.finished or entry.pinned):
                break
            entry.result()
            kept.append(entry)
        dropped = self._queue[len(kept)] if len(kept) < len(self._queue) else None
        state = {"batches": [batch_state(e.step, e.batch) for e in kept]}
        return state, dropped.sampler if dropped is not None else None

    def load_state_dict(self, state: dict) -> None:
        if "step" in state:  # a checkpoint of one batch ahead, as written before max_staleness > 1
            state = {"batches": [state]}
        for s in state.get("batches", []):
            self._queue.append(_Ahead(int(s["step"]), batch=load_batch(s)))
            self._next = int(s["step"]) + 1

    def close(self) -> None:
        """Stop the worker thread: a queued generation is cancelled, one running is aborted
        (``abort``, the engine's ``abort_generations``: nothing will train on it, and a stop
        signal's run must not wait for it) or, without one, waited for."""
        if self._pool is None:
            return
        running = any(not e.finished for e in self._queue)
        if running and self._abort is not None:
            with contextlib.suppress(Exception):  # a server already gone: nothing to abort
                self._abort()
        self._pool.shutdown(wait=True, cancel_futures=True)


# ---------------------------------------------------------------------- batches as JSON
def batch_state(step: int, b: RolloutBatch) -> dict:
    """A batch generated ahead as JSON-able data: its rows, prompts, completions (an episode's
    ``EpisodeInfo`` included) and a vision-language prompt's images and processor tensors,
    every value exact (``load_batch`` gives back an equal batch)."""
    return {
        "step": step,
        "rows": b.rows,
        "prompt_texts": b.prompt_texts,
        "prompt_ids": b.prompt_ids,
        "groups": [[dataclasses.asdict(c) for c in grp] for grp in b.groups],
        "group_size": b.group_size,
        "vision": None if b.vision is None else [_vision_state(v) for v in b.vision],
    }


def load_batch(s: dict) -> RolloutBatch:
    groups = [[_completion(c) for c in grp] for grp in s["groups"]]
    vision = s.get("vision")
    return RolloutBatch(
        s["rows"],
        s["prompt_texts"],
        s["prompt_ids"],
        groups,
        s["group_size"],
        vision=None if vision is None else [_load_vision(v) for v in vision],
    )


def _completion(c: dict) -> Completion:
    ep = c.get("episode")
    if ep is not None:
        ep = EpisodeInfo(**{**ep, "transcript": [tuple(t) for t in ep.get("transcript", [])]})
    return Completion(**{**c, "episode": ep})


def _tensor_state(t: torch.Tensor) -> dict:
    """A tensor as its raw bytes (base64), dtype and shape: exact for every dtype, bf16 too."""
    raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "data": base64.b64encode(raw).decode("ascii"),
    }


def _load_tensor(s: dict) -> torch.Tensor:
    raw = bytearray(base64.b64decode(s["data"]))
    flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    return flat.view(getattr(torch, s["dtype"])).reshape(s["shape"]).clone()


def _vision_state(v: PromptVision) -> dict:
    images = []
    for im in v.images:  # PNG: lossless for every mode a processor takes
        buf = io.BytesIO()
        im.save(buf, format="PNG")
        images.append(base64.b64encode(buf.getvalue()).decode("ascii"))
    return {"images": images, "inputs": {k: _tensor_state(t) for k, t in v.inputs.items()}}


def _load_vision(s: dict) -> PromptVision:
    from PIL import Image

    images = []
    for data in s["images"]:
        with Image.open(io.BytesIO(base64.b64decode(data))) as im:
            im.load()
            images.append(im.copy())
    return PromptVision(images, {k: _load_tensor(t) for k, t in s["inputs"].items()})


def stamp_version(groups: list[list[Completion]], version: int) -> None:
    """Label completions the engine did not label with the version that sampled them."""
    for grp in groups:
        for c in grp:
            if c.policy_version is None:
                c.policy_version = version


def staleness_stats(completions: list[Completion], trained_version: int) -> dict[str, float]:
    """``staleness_mean``/``_max``: the version being trained minus each completion's version
    (its oldest token's); ``token_lag_mean``/``_max``: the same per model token (the token's own
    version: after a partial push, the newer weights')."""
    lags = [trained_version - c.policy_version for c in completions if c.policy_version is not None]
    if not lags:
        return {}
    out = {"staleness_mean": sum(lags) / len(lags), "staleness_max": float(max(lags))}
    tokens = [
        trained_version - v
        for c in completions
        if c.policy_version is not None
        for v, m in zip(c.versions(), c.loss_mask or [1] * len(c.token_ids), strict=True)
        if m
    ]
    if tokens:
        out.update(token_lag_mean=sum(tokens) / len(tokens), token_lag_max=float(max(tokens)))
    return out
