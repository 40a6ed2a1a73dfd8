"""torch.distributed glue: process group, model wrapping (FSDP2 or DDP), reductions.

The same code runs one process (every function is a no-op or identity), several CPU processes
(gloo) and several GPUs (NCCL for CUDA tensors, gloo beside it for CPU ones: `group_backend`). Launch with ``torchrun --nproc-per-node N -m rlvr train ...``.

How a step is split: every rank draws the same global prompt indices (same seed), keeps its own
contiguous slice of whole prompts (a prompt group never spans ranks), generates, scores and
computes advantages locally (group statistics need only the group), and divides its loss sums
by the *global* counts. FSDP2 and DDP average gradients over ranks, so each rank's loss is
multiplied by the world size: the summed gradient then equals the one-process gradient.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed() -> DistInfo:
    """Join the process group torchrun describes in the environment (no-op when alone)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(local)
        dist.init_process_group(backend=group_backend(cuda))
    return DistInfo(rank=rank, world_size=world, local_rank=local)


def group_backend(cuda: bool) -> str:
    """The process group's backends: with CUDA, NCCL for CUDA tensors (FSDP2's collectives, the
    decoding flag) and gloo for CPU ones (float reductions, the sharded checkpoint's agreement
    flag, object collectives): NCCL alone refuses a CPU tensor."""
    return "cpu:gloo,cuda:nccl" if cuda else "gloo"


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def device_for(info: DistInfo, requested: str) -> torch.device:
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and info.enabled:
        return torch.device("cuda", info.local_rank)
    return torch.device(requested)


def wrap_model(model: torch.nn.Module, info: DistInfo, mode: str) -> torch.nn.Module:
    """FSDP2 (``fully_shard`` on each decoder layer, then the root) or DDP; identity when alone."""
    if not info.enabled or mode == "ddp":
        return wrap_module(model, info, mode)
    _check_mode(mode)
    from torch.distributed.fsdp import fully_shard

    # A LoRA model (peft.PeftModel) is sharded inside: its transformers model is the root, since
    # generate() and forward() both reach that module, so its hooks gather the root parameters
    # (embeddings, final norm, head) whichever way the model is called.
    root = model.get_base_model() if hasattr(model, "get_base_model") else model
    for layer in _decoder_layers(root):
        fully_shard(layer)
    fully_shard(root)
    return model


def wrap_module(module: torch.nn.Module, info: DistInfo, mode: str) -> torch.nn.Module:
    """A module without repeated blocks (PPO's value head) wrapped so that its gradients are
    averaged over ranks like the policy's: ``fully_shard`` (in place; its parameters become
    DTensors, as the policy's, so one gradient clip covers both) or DDP (returns the wrapper,
    which shares the module's parameters). Identity when alone."""
    if not info.enabled:
        return module
    _check_mode(mode)
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [info.local_rank] if next(module.parameters()).is_cuda else None
        return DistributedDataParallel(module, device_ids=ids)
    from torch.distributed.fsdp import fully_shard

    return fully_shard(module)


def _check_mode(mode: str) -> None:
    if mode not in ("fsdp2", "ddp"):
        raise ValueError(f"train.parallel={mode!r} is unknown; known: fsdp2, ddp")


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks (``model.model.layers`` for Llama/Qwen-style models)."""
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(
            f"FSDP2 wrapping: cannot find decoder layers on {type(model).__name__}; use train.parallel=ddp"
        )
    return list(layers)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module with ``generate`` and ``save_pretrained`` (DDP keeps it in ``.module``)."""
    return getattr(model, "module", model)


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def all_reduce_sum(values: list[float], info: DistInfo) -> list[float]:
    if not info.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def sum_over_ranks(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over the ranks of the process group (``t`` itself when alone), for batch
    statistics of a batch split over ranks (PPO's advantage whitening)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return t
    out = t.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def all_gather_objects(obj: Any, info: DistInfo) -> list[Any]:
    """Every rank's ``obj`` in rank order (``[obj]`` when alone)."""
    if not info.enabled:
        return [obj]
    out: list[Any] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, info: DistInfo, src: int = 0) -> Any:
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def full_state_dict(model: torch.nn.Module, info: DistInfo) -> dict[str, torch.Tensor]:
    """Unsharded CPU state dict (on every rank) for saving or weight sync."""
    model = unwrap(model)
    if not info.enabled:
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(
        model,
        options=StateDictOptions(
            full_state_dict=True, cpu_offload=True, broadcast_from_rank0=False
        ),
    )
