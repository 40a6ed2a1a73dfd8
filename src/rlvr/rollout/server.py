"""``rollout.mode=server``: the rollout-engine protocol over a vLLM server in another process.

Generation goes through vLLM's token-in token-out endpoint ``/inference/v1/generate`` (one HTTP
request per prompt, ``n`` samples each, sent concurrently; every prompt carries its own seed, so
the samples do not depend on how the server batches requests). vLLM labels every output with the
engine's weight version (``weight_versions``), which this client sets to the trainer's policy
version after each sync (``/update_weight_version``): the version on each completion is the
server's own record of which weights sampled it.

Weights move over a two-process torch.distributed group (gloo on CPUs, NCCL on GPUs) formed with
the server's worker extension (`rlvr.rollout.server_worker`), in the same buckets of whole decoder
blocks the in-process engine uses (`rlvr.rollout.weight_sync.weight_buckets`), LoRA merged on the
fly. The process-launch side is `rlvr.rollout.server_launch`.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from rlvr.rollout.adapter_sync import (
    ADAPTER_NAME,
    AdapterFolder,
    adapter_tensors,
    sync_mode,
    without_adapters,
)
from rlvr.rollout.base import Completion, SamplingParams
from rlvr.rollout.server_auth import new_token, token_from_env
from rlvr.rollout.server_launch import (
    check_port_free,
    free_port,
    http_get,
    http_post,
    server_command,
    start_server,
    stop_server,
    wait_healthy,
)
from rlvr.rollout.server_worker import DTYPES, trainer_group
from rlvr.rollout.vllm_setup import (
    DTYPE_NAMES,
    base_config,
    checkpoint_weights,
    engine_dtype,
    export_checkpoint,
)
from rlvr.rollout.weight_sync import (
    SyncStats,
    active_adapter_name,
    check_tied_lora,
    lora_merge_plan,
    reset_prefix_cache,
    weight_buckets,
)

DEFAULT_BUCKET_BYTES = 128 * 2**20


def request_seeds(params: SamplingParams, n_prompts: int) -> list[int | None]:
    """One seed per prompt: ``prompt_seeds`` when given, else derived from ``seed``."""
    if params.prompt_seeds is not None:
        if len(params.prompt_seeds) != n_prompts:
            raise ValueError(f"{len(params.prompt_seeds)} prompt seeds for {n_prompts} prompts")
        return list(params.prompt_seeds)
    if params.seed is None:
        return [None] * n_prompts
    return [(params.seed * 1_000_003 + i) % 2**63 for i in range(n_prompts)]


def sampling_body(params: SamplingParams, seed: int | None) -> dict:
    """vLLM ``SamplingParams`` as JSON, the same settings the in-process engine uses."""
    return {
        "n": params.n,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "max_tokens": params.max_new_tokens,
        "stop": list(params.stop) or None,
        "include_stop_str_in_output": True,
        "logprobs": 0,  # the sampled token's log-prob only
        "skip_special_tokens": True,
        "seed": seed,
    }


def token_versions(spans: list[dict], n_tokens: int) -> list[int]:
    """The policy version of each output token from vLLM's ``weight_versions`` spans (output
    tokens ``[start, end)`` sampled by weights labelled ``version``); every token must be covered
    by a label this client set (an integer)."""
    out: list[int | None] = [None] * n_tokens
    for span in spans:
        if not str(span["version"]).isdigit():
            raise RuntimeError(f"a completion spans weights not labelled by a trainer: {spans}")
        for i in range(int(span["start"]), min(int(span["end"]), n_tokens)):
            out[i] = int(span["version"])
    if None in out:
        raise RuntimeError(f"weight-version spans {spans} leave tokens of {n_tokens} unlabelled")
    return out  # type: ignore[return-value]


def parse_choice(prompt_index: int, choice: dict, *, partial: bool = False) -> Completion:
    """One ``/inference/v1/generate`` choice (output_mode text) as a ``Completion``.

    ``partial`` (``rollout.partial``): a choice whose tokens span several weight versions keeps
    each token's version (``Completion.token_versions``); without it that is an error (a push
    landed during a generation that should have held it back)."""
    token_ids = list(choice["token_ids"])
    content = (choice.get("logprobs") or {}).get("content") or []
    if len(content) != len(token_ids):
        raise RuntimeError("the rollout server returned no log-prob for some sampled tokens")
    if choice["finish_reason"] not in ("stop", "length"):
        raise RuntimeError(f"the rollout server finished with {choice['finish_reason']!r}")
    spans = choice.get("weight_versions") or []
    versions = {span["version"] for span in spans}
    per_token = None
    if len(versions) > 1:
        if not partial:
            raise RuntimeError(f"a completion was sampled by several weight versions {versions}")
        per_token = token_versions(spans, len(token_ids))
        versions = {str(min(per_token))}
    version = versions.pop() if versions else None
    return Completion(
        prompt_index=prompt_index,
        token_ids=token_ids,
        logprobs=[float(c["logprob"]) for c in content],
        text=choice["text"],
        finish_reason=choice["finish_reason"],
        policy_version=int(version) if version is not None and version.isdigit() else None,
        token_versions=per_token,
    )


class ServerEngine:
    """A vLLM server process behind the rollout-engine protocol (``rollout.mode=server``)."""

    name = "vllm-server"
    remote = True  # generation runs elsewhere: training.overlap may wait for it in a thread

    def __init__(
        self,
        url: str,
        *,
        dtype: torch.dtype,
        tied: bool,
        lora_plan=None,
        adapter: str = "default",
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        sync_host: str = "127.0.0.1",
        sync_port: int = 0,
        timeout_s: float = 600.0,
        process=None,
        owned_dir: Path | None = None,
        token: str | None = None,
        partial: bool = False,
        adapter_folder: AdapterFolder | None = None,
    ):
        """Connect to the server at ``url`` and form the weight-sync group with it (the server
        drops the group of a previous trainer: a restarted trainer reconnects). ``token``: the
        server's shared secret (`rlvr.rollout.server_auth`), sent with every request."""
        self.url = url.rstrip("/")
        self.token = token
        self.dtype, self._tied, self._plan, self._adapter = (
            dtype,
            tied,
            dict(lora_plan or {}),
            adapter,
        )
        self.bucket_bytes, self.timeout_s = bucket_bytes, timeout_s
        self._process, self._owned_dir = process, owned_dir
        self.partial = partial  # rollout.partial: completions may span pushes (``paused``)
        self._paused = False
        self._adapter_folder = adapter_folder  # adapter-only LoRA sync (rollout.lora_sync)
        self._adapter_registered = False
        self._told_preempt = False  # another client's requests were preempted at a push
        self.last_sync_stats: SyncStats | None = None
        self._version = -1  # unknown until the first sync
        self._group = self._store = None
        http_get(self.url, "/health", timeout_s=30)
        self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        self._join(sync_host, sync_port or free_port(sync_host))
        # a previous trainer killed inside a partial push (rollout.partial) may have left the
        # server paused: every generation would wait for a /resume that never comes
        http_post(self.url, "/resume", {}, timeout_s=60, token=self.token)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_trainer(cls, cfg, model: torch.nn.Module, tokenizer, *, workdir=None) -> ServerEngine:
        """Connect to ``rollout.server_url`` and push ``model``'s weights, or (no URL) start a
        server on a folder of ``model``'s current weights and stop it on ``close()``."""

        r = cfg.rollout
        plan = lora_merge_plan(model)
        tied = bool(getattr(base_config(model), "tie_word_embeddings", False))
        check_tied_lora(plan, tied)
        dtype = engine_dtype(cfg, next(model.parameters()).device)
        adapter = active_adapter_name(model) if plan else "default"
        by_adapter = sync_mode(cfg, model, plan, adapter) == "adapter"
        kw = dict(
            dtype=dtype, tied=tied, lora_plan=plan, adapter=adapter, timeout_s=r.server_timeout_s
        )
        kw.update(sync_host=r.sync_host, sync_port=r.sync_port, partial=r.partial)
        if r.server_url:  # a `rlvr rollout-server`: its token comes in this process's environment
            kw["adapter_folder"] = AdapterFolder.create(model, adapter) if by_adapter else None
            engine = cls(r.server_url, **kw, token=token_from_env())
            if by_adapter:  # the adapter goes on the base model, not on what the server holds
                engine.load_base(model.state_dict().items())
            engine.load_weights(model.state_dict().items())
            engine.policy_version = 0
            return engine
        check_port_free("127.0.0.1", r.server_port)
        folder = Path(tempfile.mkdtemp(prefix="rlvr-server-", dir=workdir))
        proc = None
        try:
            with torch.no_grad():
                state = model.state_dict().items()
                weights = (
                    checkpoint_weights(without_adapters(state), {}, adapter=adapter, tied=tied)
                    if by_adapter  # the server serves the base model and loads the adapter
                    else checkpoint_weights(state, plan, adapter=adapter, tied=tied)
                )
                export_checkpoint(folder / "model", model, tokenizer, weights, dtype)
            url = f"http://127.0.0.1:{r.server_port}"
            log = folder / "server.log"
            token = new_token()  # this server's alone, kept in memory and its environment
            proc = start_server(
                server_command(cfg, folder / "model", dtype, port=r.server_port), log, token
            )
            wait_healthy(url, proc, r.server_timeout_s, log)
            kw["adapter_folder"] = AdapterFolder.create(model, adapter) if by_adapter else None
            engine = cls(url, **kw, process=proc, owned_dir=folder, token=token)
            if by_adapter:
                engine.load_weights(model.state_dict().items())  # the adapter it starts with
            engine.policy_version = 0  # it started from these very weights
            return engine
        except BaseException:
            if proc is not None:
                stop_server(proc)
            shutil.rmtree(folder, ignore_errors=True)
            raise

    # ------------------------------------------------------------------ versions
    @property
    def policy_version(self) -> int:
        return self._version

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        """Label the server's weights: every later completion carries this version."""
        http_post(
            self.url,
            "/update_weight_version",
            {"new_version": str(int(version))},
            timeout_s=60,
            token=self.token,
        )
        self._version = int(version)

    # ------------------------------------------------------------------ generation
    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams
    ) -> list[list[Completion]]:
        """``params.n`` completions per prompt, one concurrent request per prompt."""
        for i, p in enumerate(prompt_ids):
            if not p:
                raise ValueError(f"prompt_ids[{i}] is empty")
        seeds = request_seeds(params, len(prompt_ids))
        bodies = [
            {
                "token_ids": list(p),
                "sampling_params": sampling_body(params, s),
                "output_mode": "text",
            }
            for p, s in zip(prompt_ids, seeds, strict=True)
        ]
        if self._adapter_folder is not None:  # the served adapter, by its name
            for body in bodies:
                body["model"] = ADAPTER_NAME
        post = lambda body: http_post(  # noqa: E731
            self.url, "/inference/v1/generate", body, token=self.token
        )
        with ThreadPoolExecutor(max(1, min(32, len(bodies)))) as pool:
            replies = list(pool.map(post, bodies))
        return [
            [
                parse_choice(i, c, partial=self.partial)
                for c in sorted(reply["choices"], key=lambda c: c["index"])
            ]
            for i, reply in enumerate(replies)
        ]

    @contextlib.contextmanager
    def paused(self):
        """A weight push during a generation (``rollout.partial``), with vLLM's own pause: its
        requests are frozen where they are (``/pause?mode=keep``), the push inside this block
        loads the new weights and preempts them (``load_weights`` resets the prefix cache with
        ``reset_running_requests``: their KV cache came from the old weights, so each is
        recomputed from its prompt and tokens so far on the new ones), the version label is set,
        and ``/resume`` continues them. Their later tokens carry the new label and its log-probs.
        Whatever stops the block, the pause call itself included (an exception raised while it
        was in flight, after the server paused), ``/resume`` is sent."""
        self._paused = True
        try:
            http_post(
                self.url,
                "/pause?mode=keep&clear_cache=false",
                {},
                timeout_s=self.timeout_s,
                token=self.token,
            )
            yield
        finally:
            self._paused = False
            http_post(self.url, "/resume", {}, timeout_s=self.timeout_s, token=self.token)

    def abort_generations(self) -> None:
        """End every generation in flight on the server (vLLM's ``/abort_requests``): their
        replies come back aborted, so the ``generate`` waiting on them raises at once (a run that
        stops does not wait for a batch ahead it will not train on)."""
        http_post(self.url, "/abort_requests", {}, timeout_s=30, token=self.token)

    # ------------------------------------------------------------------ weight sync
    def _rpc(self, method: str, *args: str, timeout_s: float | None = None):
        body = {"method": method, "args": [str(a) for a in args]}
        return http_post(
            self.url,
            "/collective_rpc",
            body,
            timeout_s=timeout_s or self.timeout_s,
            token=self.token,
        )

    def _rpc_during(self, fn, method: str, *args: str):
        """Call ``method`` on the server while ``fn()`` runs here (the two sides of a collective).

        Both run in threads so that a failure of either side is raised at once (a server without
        the worker extension answers the call with an error while ``fn`` would wait for it until
        the group's timeout)."""
        out: dict = {}

        def guarded(key: str, target):
            try:
                out[key] = target()
            except BaseException as exc:  # re-raised in the caller's thread
                out[f"{key}_error"] = exc

        threads = [
            threading.Thread(target=guarded, args=("reply", lambda: self._rpc(method, *args))),
            threading.Thread(target=guarded, args=("local", fn)),
        ]
        for t in threads:
            t.daemon = True  # a side left blocked by a failed peer must not keep the process
            t.start()
        deadline = time.monotonic() + self.timeout_s
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            if "reply_error" in out or "local_error" in out:
                break
            threads[0].join(0.05)
        for key in ("reply_error", "local_error"):
            if key in out:
                raise out[key]
        if "reply" not in out or "local" not in out:
            raise TimeoutError(f"rollout server at {self.url}: {method} did not finish")
        return out["reply"]

    def _join(self, host: str, port: int) -> None:
        def form():
            self._group, self._store = trainer_group(host, port, 2, self.backend, self.timeout_s)

        self._rpc_during(form, "rlvr_join", host, port, 2, 1, self.backend)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Send the trainer's weights (LoRA merged) bucket by bucket, or (adapter-only sync) the
        adapter alone; clears the prefix cache."""
        if self._adapter_folder is not None:
            self._load_adapter(named_tensors)
            return
        self._load_full(named_tensors, self._plan)

    def load_base(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Adapter-only sync: the base model's weights (the LoRA tensors left out, not merged),
        pushed when a trainer connects to a server it did not start, which may hold what a
        previous trainer pushed (full weights, or a LoRA merged in)."""
        self._load_full(without_adapters(named_tensors), {})

    def _load_full(self, named_tensors: Iterable[tuple[str, torch.Tensor]], plan: dict) -> None:
        t0, stats = time.perf_counter(), SyncStats()
        weights = checkpoint_weights(
            named_tensors, plan, adapter=self._adapter, tied=self._tied, stats=stats
        )
        opts = torch.distributed.BroadcastOptions()
        opts.rootRank = 0
        with torch.no_grad():
            for bucket in weight_buckets(weights, self.bucket_bytes, dtype=self.dtype):
                bad = [n for n, t in bucket if t.dtype != self.dtype]
                if bad:
                    raise ValueError(
                        f"weight sync sends {DTYPE_NAMES[self.dtype]} tensors only: {bad[:5]}"
                    )
                device = "cuda" if self.backend == "nccl" else "cpu"
                flat = torch.cat([t.reshape(-1).to(device) for _, t in bucket])
                manifest = {
                    "dtype": DTYPE_NAMES[self.dtype],
                    "buckets": [
                        {
                            "names": [n for n, _ in bucket],
                            "shapes": [list(t.shape) for _, t in bucket],
                        }
                    ],
                }
                send = lambda: self._group.broadcast([flat], opts).wait()  # noqa: B023, E731
                self._rpc_during(send, "rlvr_receive", json.dumps(manifest))
                stats.buckets += 1
                stats.tensors += len(bucket)
                stats.bytes += flat.numel() * flat.element_size()
        if self._tied:
            self._rpc("rlvr_refresh_tied")
        self._reset_prefix_cache()
        stats.seconds = time.perf_counter() - t0
        self.last_sync_stats = stats

    def _load_adapter(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The adapter's tensors into its folder (the server reads it: same machine), then the
        first time registered with vLLM's ``/v1/load_lora_adapter``, later reloaded in place in
        the worker (``rlvr_reload_adapter``: a registration with ``load_inplace`` would make every
        request reload it at every scheduling step)."""
        t0 = time.perf_counter()
        with torch.no_grad():
            tensors = adapter_tensors(named_tensors, self._adapter, self.dtype)
        if not tensors:
            raise ValueError(f"adapter sync: no LoRA tensors of adapter {self._adapter!r} sent")
        nbytes = self._adapter_folder.write(tensors)
        path = str(self._adapter_folder.path)
        if not self._adapter_registered:
            self._register_adapter(path)
        else:
            self._rpc("rlvr_reload_adapter", path)
        self._reset_prefix_cache()
        self.last_sync_stats = SyncStats(
            tensors=len(tensors), bytes=nbytes, buckets=1, seconds=time.perf_counter() - t0
        )

    def _register_adapter(self, path: str) -> None:
        """Register the adapter folder under rlvr's name. A name the server already holds (a
        previous trainer's adapter: `rlvr train --resume` against the same `rlvr rollout-server`,
        its folder removed) is unloaded first: vLLM refuses a second registration of a name."""
        served = http_get(self.url, "/v1/models", token=self.token).get("data") or []
        if any(m.get("id") == ADAPTER_NAME for m in served):
            http_post(
                self.url, "/v1/unload_lora_adapter", {"lora_name": ADAPTER_NAME}, token=self.token
            )
        try:
            http_post(
                self.url,
                "/v1/load_lora_adapter",
                {"lora_name": ADAPTER_NAME, "lora_path": path},
                token=self.token,
            )
        except RuntimeError as exc:
            raise RuntimeError(
                f"rollout server at {self.url} cannot load the LoRA adapter ({exc}); start it "
                "with the run's config (model.lora.enabled=true: vLLM's --enable-lora), or "
                "set rollout.lora_sync=merged"
            ) from exc
        self._adapter_registered = True

    def _reset_prefix_cache(self) -> None:
        """Drop the KV cache of the old weights; while ``paused``, the frozen requests' too."""
        if not self._paused:
            reset_prefix_cache(
                lambda: self._reset_reply("/reset_prefix_cache", 60),
                f"rollout server at {self.url}",
                fallback=self._preempt_and_reset,
                attempts=10,
                wait_s=0.05,
            )
            return
        if not self._reset_reply("/reset_prefix_cache?reset_running_requests=true", None):
            raise RuntimeError(
                f"rollout server at {self.url}: the KV cache of the paused requests could not be "
                "dropped after a push; their next tokens would read the old weights' cache"
            )

    def _preempt_and_reset(self) -> bool:
        """The reset that preempts the running requests (they recompute on the new weights):
        rlvr's own generations never run during a push (training/overlap.py), so what holds
        blocks after the retries is another client of a standalone server; said once."""
        ok = self._reset_reply("/reset_prefix_cache?reset_running_requests=true", None)
        if ok and not self._told_preempt:
            self._told_preempt = True
            print(
                f"rlvr: rollout server at {self.url}: requests of another client held the KV "
                "cache at a weight push; they were preempted and recompute on the new weights",
                file=sys.stderr,
                flush=True,
            )
        return ok

    def _reset_reply(self, path: str, timeout_s: float | None) -> bool:
        """vLLM's ``{"success": bool}``; an answer without it (a vLLM whose reset says nothing)
        raises at once: read as a refusal it would be retried and reported as blocks held."""
        reply = http_post(self.url, path, {}, timeout_s=timeout_s, token=self.token)
        if not isinstance(reply, dict) or not isinstance(reply.get("success"), bool):
            raise RuntimeError(
                f"rollout server at {self.url}: {path.partition('?')[0]} answered {reply!r}, "
                "not vLLM's {\"success\": true|false}: the server's vLLM does not say whether "
                "the old weights' KV cache was dropped (run it with the vLLM rlvr pins)"
            )
        return reply["success"]

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Leave the weight-sync group; stop the server if this engine started it."""
        proc, self._process = self._process, None
        if self._group is not None:
            with contextlib.suppress(ConnectionError, RuntimeError, TimeoutError):
                self._rpc("rlvr_leave", timeout_s=30)  # fails when the server is gone already
            self._group = self._store = None
        if proc is not None:
            stop_server(proc)
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None
        if self._adapter_folder is not None:
            self._adapter_folder.remove()


__all__ = ["DTYPES", "ServerEngine", "http_get", "http_post"]
