"""The rollout server's side of weight sync: a vLLM worker extension (``--worker-extension-cls
rlvr.rollout.server_worker.WeightReceiver``) whose methods the trainer calls through vLLM's dev
endpoint ``POST /collective_rpc`` (``VLLM_SERVER_DEV_MODE=1``), plus the process-group helper
both sides use.

A sync: the trainer calls ``rlvr_receive(manifest)`` over HTTP and, while that call waits,
broadcasts each bucket's tensors (one flat buffer per bucket) from rank 0 of a two-process
torch.distributed group (gloo on CPUs, NCCL on GPUs); the worker receives each bucket and hands it
to vLLM's own ``reload_weights`` (which re-runs vLLM's post-load processing), exactly like the
in-process engine (`rlvr.rollout.vllm`). The bucket layout (whole decoder blocks) comes from
`rlvr.rollout.weight_sync.weight_buckets` on the trainer side.

Importing this module imports torch only; vLLM is imported inside the worker methods.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
from datetime import timedelta

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def group_prefix(host: str, port: int) -> str:
    """The store prefix vLLM's ``stateless_init_torch_distributed_process_group`` uses."""
    return f"tcp://{host}:{port}"


def trainer_group(host: str, port: int, world_size: int, backend: str, timeout_s: float):
    """Rank 0 of the weight-sync group: hosts the TCP store on ``host:port`` and returns a
    process group that touches no global torch.distributed state (the trainer may have its own
    default group under torchrun). The worker joins with vLLM's stateless helper (same store
    prefix)."""
    from torch.distributed import PrefixStore, TCPStore

    timeout = timedelta(seconds=timeout_s)
    # torch's store listens on every interface whatever ``host`` says: hand it a socket bound to
    # ``host`` alone (rollout.sync_host), so the rendezvous is not open to the whole network
    sock = socket.create_server((host, port), backlog=128)
    fd = sock.detach()  # the store owns the socket from here
    store = TCPStore(host, port, world_size, is_master=True, timeout=timeout, master_listen_fd=fd)
    prefix = PrefixStore(group_prefix(host, port), store)
    if backend == "gloo":
        from torch.distributed import ProcessGroupGloo

        return ProcessGroupGloo(prefix, 0, world_size, timeout=timeout), store
    from torch.distributed import ProcessGroupNCCL

    return ProcessGroupNCCL(prefix, 0, world_size), store


def flat_layout(manifest_bucket: dict) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, shape, numel) of each tensor of one bucket, in the order they sit in its buffer."""
    return [
        (name, tuple(shape), math.prod(shape))
        for name, shape in zip(manifest_bucket["names"], manifest_bucket["shapes"], strict=True)
    ]


class WeightReceiver:
    """Mixed into vLLM's worker class. Arguments arrive as strings (the dev endpoint passes only
    serialised strings)."""

    def rlvr_join(self, host: str, port: str, world_size: str, rank: str, backend: str) -> str:
        """Join the trainer's weight-sync group (as ``rank``) through vLLM's stateless helper."""
        from vllm.distributed.utils import stateless_init_torch_distributed_process_group

        old = getattr(self, "_rlvr_group", None)
        if old is not None:  # a restarted trainer reconnects: drop the dead group
            self.rlvr_leave()
        self._rlvr_group = stateless_init_torch_distributed_process_group(
            host, int(port), int(rank), int(world_size), backend=backend
        )
        return "joined"

    def rlvr_leave(self) -> str:
        from vllm.distributed.utils import stateless_destroy_torch_distributed_process_group

        group, self._rlvr_group = getattr(self, "_rlvr_group", None), None
        if group is not None:
            # the peer may be gone (a killed trainer): nothing left to tear down cleanly
            with contextlib.suppress(Exception):
                stateless_destroy_torch_distributed_process_group(group)
        return "left"

    def rlvr_receive(self, manifest: str) -> dict:
        """Receive every bucket of ``manifest`` (JSON: dtype, buckets of names and shapes) from
        rank 0 and load each into the model; returns the counts received."""
        group = getattr(self, "_rlvr_group", None)
        if group is None:
            raise RuntimeError("rlvr_receive before rlvr_join: no weight-sync group")
        plan = json.loads(manifest)
        dtype = DTYPES[plan["dtype"]]
        device = self.device if getattr(self, "device", None) is not None else "cpu"
        tensors = nbytes = 0
        for bucket in plan["buckets"]:
            layout = flat_layout(bucket)
            flat = torch.empty(sum(n for _, _, n in layout), dtype=dtype, device=device)
            group.broadcast(flat, 0).wait()
            weights, start = [], 0
            for name, shape, numel in layout:
                weights.append((name, flat[start : start + numel].view(shape)))
                start += numel
            self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
            tensors += len(weights)
            nbytes += flat.numel() * flat.element_size()
        return {"tensors": tensors, "bytes": nbytes}

    def rlvr_reload_adapter(self, path: str) -> int:
        """Adapter-only LoRA sync (`rlvr.rollout.adapter_sync`): reload the one adapter the
        server serves from ``path``, in place (its id and name stay, so requests in flight and
        the front end's registration keep pointing at it); returns its id."""
        from vllm.lora.request import LoRARequest

        from rlvr.rollout.adapter_sync import ADAPTER_NAME

        ids = sorted(self.model_runner.lora_manager.list_adapters())
        if len(ids) != 1:
            raise RuntimeError(f"rlvr_reload_adapter: the worker holds adapters {ids}, not one")
        self.add_lora(LoRARequest(ADAPTER_NAME, ids[0], path, load_inplace=True))
        return ids[0]

    def rlvr_refresh_tied(self) -> int:
        """After a sync of a model with tied embeddings (see ``refresh_tied_output_layers``)."""
        from rlvr.rollout.weight_sync import refresh_tied_output_layers

        return refresh_tied_output_layers(self)
