"""The weight stream from FSDP2 shards, in 2 real processes (gloo), without vLLM.

Each rank holds half of every tensor (a DTensor shard); ``checkpoint_weights`` gathers them with
``full_tensor()`` one tensor at a time, as ``weight_buckets`` pulls them. Checked: every rank
gets the unsharded model's exact tensors, in buckets of whole blocks, and the stream never pulls
more than one tensor past the bucket it hands out (so a rank holds one bucket of full tensors,
not the model).
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        from torch.distributed.tensor import DTensor

        from rlvr.distributed import DistInfo, wrap_model
        from rlvr.rollout.vllm_setup import checkpoint_weights
        from rlvr.rollout.weight_sync import weight_buckets
        from rlvr.training.tiny import build_char_tokenizer, build_tiny_model

        model = build_tiny_model(build_char_tokenizer(), seed=0, hidden=64, layers=3)
        full = {k: v.clone() for k, v in model.state_dict().items()}
        wrap_model(model, DistInfo(rank=rank, world_size=2), "fsdp2")
        state = model.state_dict()
        sharded = [k for k, v in state.items() if isinstance(v, DTensor)]
        assert sharded == list(full), "every tensor is an FSDP2 shard"
        pulled = 0

        def counted():
            nonlocal pulled
            for item in state.items():
                pulled += 1
                yield item

        seen, buckets, ahead = {}, [], 0
        stream = checkpoint_weights(counted(), {}, adapter="default", tied=True)
        for bucket in weight_buckets(stream, bucket_bytes=1):
            seen.update(bucket)
            buckets.append([n for n, _ in bucket])
            ahead = max(ahead, pulled - len(seen))
        expected = {k: v for k, v in full.items() if k != "lm_head.weight"}  # tied: not sent
        assert list(seen) == list(expected)
        assert all(torch.equal(seen[k], expected[k]) for k in expected)
        results[rank] = (buckets, ahead)
    finally:
        dist.destroy_process_group()


def test_fsdp2_shards_stream_as_full_tensors_one_bucket_at_a_time():
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(_free_port(), results), nprocs=2, join=True)
        out = dict(results)
    assert out[0] == out[1]  # both ranks walked the same buckets (the gathers are collectives)
    buckets, ahead = out[0]
    # bucket_bytes=1: one bucket per unit (embedding, each of the 3 blocks, final norm)
    assert [len(b) for b in buckets] == [1, 9, 9, 9, 1]
    assert buckets[1][0].startswith("model.layers.0.")
    # one tensor of look-ahead: the first tensor of the next block closes the current bucket
    assert ahead == 1
