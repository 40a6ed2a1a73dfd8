"""Trainer weights -> rollout-engine weights: LoRA merged on the fly, streamed in buckets.

Pure torch (no vLLM import at module level), so the conversions are tested without an engine:

- ``lora_merge_plan(model)`` reads each peft LoRA layer's scaling from the trainer's model (the
  scaling is not in the state dict: it is ``alpha / r``, or ``alpha / sqrt(r)`` with rsLoRA).
- ``merged_named_weights(named, plan)`` turns a peft state dict (``base_model.model.…``,
  ``….base_layer.weight``, ``lora_A``/``lora_B``) into plain checkpoint names with the adapter
  merged: ``W + scaling * B @ A``. A plain model's state dict passes through unchanged.
- ``weight_buckets(named, bucket_bytes)`` groups the stream into buckets of about
  ``bucket_bytes`` that never split one decoder block: vLLM fuses q/k/v and gate/up of a block
  into one layer and processes a layer only when all of its parts arrived in the same reload call.
- ``full_tensors(named)`` gathers FSDP2's DTensor shards one tensor at a time (a collective every
  rank runs in the same order), so a bucket, never the whole model, is materialised on a rank.
- ``refresh_tied_output_layers`` (run on the vLLM worker after a reload) and ``check_tied_lora``:
  the tied-embedding cases a reload alone gets wrong.
- ``reset_prefix_cache(reset, where)``: drop the KV cache the old weights computed, retried
  while vLLM says blocks are still held, raised if it never succeeds.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

PEFT_PREFIX = "base_model.model."
# The first ".<integer>." of a name (model.layers.12.mlp.up_proj.weight -> "model.layers.12.").
_BLOCK = re.compile(r"^(.*?\.\d+\.)")
# peft adapter tensors: <module>.lora_A.<adapter>.weight, <module>.lora_embedding_A.<adapter>
_LORA = re.compile(r"^(?P<module>.+)\.(?P<kind>lora_A|lora_B|lora_embedding_A|lora_embedding_B)\.")
_DORA = ".lora_magnitude_vector."


@dataclass(frozen=True)
class LoraMerge:
    """How to merge one adapted module: ``W += scaling * B @ A`` (transposed where noted)."""

    scaling: float
    embedding: bool = False  # peft Embedding: A is [r, num_embeddings], B is [dim, r]
    fan_in_fan_out: bool = False  # GPT-2 Conv1D stores W transposed


@dataclass
class SyncStats:
    """What one ``load_weights`` call moved."""

    tensors: int = 0
    bytes: int = 0
    buckets: int = 0
    lora_merged: int = 0
    seconds: float = 0.0


def full_tensors(
    named: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """The stream with every DTensor (an FSDP2 shard) replaced by its full tensor, lazily.

    ``full_tensor()`` is an all-gather: every rank must pull the same names in the same order (a
    model's ``state_dict()`` is), and a consumer that keeps one bucket at a time keeps one
    bucket of full tensors. Plain tensors (one process, DDP) pass through.
    """
    from torch.distributed.tensor import DTensor

    for name, tensor in named:
        yield name, tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def lora_merge_plan(model: torch.nn.Module) -> dict[str, LoraMerge]:
    """Module name (as in the state dict, peft prefix kept) -> how to merge its active adapter.

    Empty for a model without peft LoRA layers. Raises ``ValueError`` for adapters that cannot be
    merged into plain weights here (DoRA, several active adapters).
    """
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # peft missing: nothing can be a LoRA layer
        return {}
    plan: dict[str, LoraMerge] = {}
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        active = [a for a in module.active_adapters if a in module.scaling]
        if len(active) != 1:
            raise ValueError(
                f"LoRA layer {name}: weight sync merges exactly one active adapter, "
                f"found {active or 'none'}"
            )
        adapter = active[0]
        if module.use_dora.get(adapter, False):
            raise ValueError(f"LoRA layer {name}: DoRA adapters are not supported by weight sync")
        plan[name] = LoraMerge(
            scaling=float(module.scaling[adapter]),
            embedding=adapter in getattr(module, "lora_embedding_A", {}),
            fan_in_fan_out=bool(getattr(module, "fan_in_fan_out", False)),
        )
    return plan


def active_adapter_name(model: torch.nn.Module) -> str:
    """The peft adapter being trained ("default" unless the user named it)."""
    name = getattr(model, "active_adapter", "default")
    return name if isinstance(name, str) else name[0]


def _lora_delta(a: torch.Tensor, b: torch.Tensor, merge: LoraMerge) -> torch.Tensor:
    """``scaling * B @ A`` in float32, laid out like the base weight."""
    delta = b.float() @ a.float()
    if merge.embedding or merge.fan_in_fan_out:
        delta = delta.T
    return delta * merge.scaling


def merged_named_weights(
    named: Iterable[tuple[str, torch.Tensor]],
    plan: dict[str, LoraMerge] | None = None,
    *,
    adapter: str = "default",
    stats: SyncStats | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Plain checkpoint names and tensors, with every LoRA adapter in ``plan`` merged.

    A module's merged weight is yielded as soon as its base weight, ``lora_A`` and ``lora_B`` have
    all arrived, so the stream stays in module order. Tensors of other adapters are dropped; for
    ``modules_to_save`` the trained copy replaces the original. Each merge is counted in
    ``stats.lora_merged`` when ``stats`` is given. Raises ``ValueError`` when LoRA
    tensors arrive for a module the plan does not know, or a module's parts never all arrive.
    """
    plan = plan or {}
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for raw_name, tensor in named:
        if _DORA in raw_name:
            raise ValueError(f"{raw_name}: DoRA tensors cannot be merged by weight sync")
        if ".original_module." in raw_name:
            continue  # modules_to_save: the trained copy below replaces it
        if ".modules_to_save." in raw_name:
            head, _, tail = raw_name.partition(".modules_to_save.")
            own, _, param = tail.partition(".")
            if own == adapter:
                yield _strip(f"{head}.{param}"), tensor
            continue
        lora = _LORA.match(raw_name)
        if lora:
            module, kind = lora["module"], lora["kind"]
            own, _, param = raw_name[lora.end() :].partition(".")
            if own != adapter:
                continue  # an inactive adapter's tensor
            if param not in ("weight", ""):  # "" for embedding adapters (bare parameters)
                raise ValueError(f"{raw_name}: only LoRA weights can be merged, not {param!r}")
            if module not in plan:
                raise ValueError(
                    f"{raw_name}: LoRA tensor of a module without a known scaling; build the "
                    "plan with lora_merge_plan(model) from the trainer's peft model"
                )
            pending.setdefault(module, {})[kind[-1]] = tensor  # "A" or "B"
        elif ".base_layer." in raw_name:
            module, _, param = raw_name.partition(".base_layer.")
            if param != "weight" or module not in plan:
                yield _strip(f"{module}.{param}"), tensor
                continue
            pending.setdefault(module, {})["W"] = tensor
        else:
            yield _strip(raw_name), tensor
            continue
        parts = pending[module]
        if len(parts) == 3:
            del pending[module]
            w = parts["W"]
            merged = (w.float() + _lora_delta(parts["A"], parts["B"], plan[module])).to(w.dtype)
            if stats is not None:
                stats.lora_merged += 1
            yield _strip(f"{module}.weight"), merged
    if pending:
        missing = {m: sorted({"W", "A", "B"} - set(p)) for m, p in pending.items()}
        raise ValueError(f"LoRA merge incomplete, parts never arrived: {missing}")


def _strip(name: str) -> str:
    return name[len(PEFT_PREFIX) :] if name.startswith(PEFT_PREFIX) else name


def block_key(name: str) -> str:
    """Which unit a tensor belongs to: its decoder block (``model.layers.3.``), else itself."""
    m = _BLOCK.match(name)
    return m.group(1) if m else name


def weight_buckets(
    named: Iterable[tuple[str, torch.Tensor]],
    bucket_bytes: int,
    *,
    dtype: torch.dtype | None = None,
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Buckets of detached tensors (cast to ``dtype``), each holding whole decoder blocks.

    A bucket is closed at the first block boundary after it reaches ``bucket_bytes``, so a bucket
    holds at least one whole block even when that block alone is larger. Raises ``ValueError`` if
    a block's tensors are not contiguous in the stream (the block would be split across buckets).
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    current: str | None = None
    closed: set[str] = set()
    for name, tensor in named:
        key = block_key(name)
        if key != current:
            if key in closed:
                raise ValueError(
                    f"{name}: tensors of {key!r} are not contiguous in the weight stream"
                )
            if current is not None:
                closed.add(current)
            if size >= bucket_bytes:
                yield bucket
                bucket, size = [], 0
            current = key
        t = tensor.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        bucket.append((name, t))
        size += t.numel() * t.element_size()
    if bucket:
        yield bucket


def refresh_tied_output_layers(worker) -> int:
    """Re-run the post-load processing of layers that share their weight with another layer.

    Runs on the vLLM worker (``collective_rpc``). With tied embeddings the output layer shares the
    embedding's weight but receives no tensor of its own in a reload, so vLLM never re-processes
    it; on the CPU backend that processing packs a private copy of the weight for the GEMM
    kernel, which would keep computing logits from the old embedding. Returns the layers redone.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    owners: dict[int, list[torch.nn.Module]] = {}
    for module in worker.model_runner.get_model().modules():
        weight = module._parameters.get("weight")
        if weight is not None:
            owners.setdefault(id(weight), []).append(module)
    redone = 0
    for modules in owners.values():
        if len(modules) < 2:
            continue
        for module in modules:
            method = getattr(module, "quant_method", None)
            if isinstance(method, UnquantizedEmbeddingMethod):
                method.process_weights_after_loading(module)
                redone += 1
    return redone


def check_tied_lora(plan: dict[str, LoraMerge], tied: bool) -> None:
    """The engine's tied output layer is its embedding: a LoRA on the embedding alone cannot be
    merged into it without changing the output layer too."""
    if tied:
        bad = [m for m, merge in plan.items() if merge.embedding]
        if bad:
            raise ValueError(
                f"LoRA on a tied embedding ({bad}) cannot be synced to vLLM; "
                "leave embed_tokens out of model.lora.target_modules"
            )


def reset_prefix_cache(
    reset: Callable[[], bool],
    where: str,
    *,
    fallback: Callable[[], bool] | None = None,
    attempts: int = 20,
    wait_s: float = 0.1,
) -> None:
    """Call ``reset`` (vLLM's prefix-cache reset; False while blocks are still held by running
    requests or KV transfers, which vLLM says to retry) until it succeeds, then ``fallback``
    once if given (a reset that preempts the requests holding blocks), or raise. A reset left
    undone lets later requests reuse the KV cache the old weights computed for a shared prompt
    prefix (a group's prompt, an epoch's second pass): their tokens would read the old policy
    while labelled with the new version."""
    for i in range(attempts):
        if reset():
            return
        time.sleep(wait_s * min(i + 1, 5))
    if fallback is not None and fallback():
        return
    raise RuntimeError(
        f"{where}: the prefix cache could not be dropped after a weight push ({attempts} tries, "
        "blocks still held); requests sharing a prompt prefix would reuse the old weights' "
        "KV cache"
    )
