"""PPO's advantage whitening over a batch split across 2 real processes (gloo): the mean and
variance are the whole batch's, so each rank's slice comes out as in one process."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlvr.algorithms import whiten
from rlvr.distributed import sum_over_ranks

# Two ranks, 3 tokens each, the last masked out on rank 1: valid values 1, 2, 3 | 5, 9.
# Whole batch: mean 4, population variance (9 + 4 + 1 + 1 + 25) / 5 = 8.
VALUES = [torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[5.0, 9.0, 100.0]])]
MASKS = [torch.tensor([[1, 1, 1]]), torch.tensor([[1, 1, 0]])]


def _rank(rank: int, init: str, out) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        out[rank] = whiten(VALUES[rank], MASKS[rank], total=sum_over_ranks)
    finally:
        dist.destroy_process_group()


def test_whitening_uses_the_statistics_of_every_rank(tmp_path):
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(f"file://{tmp_path / 'store'}", out), nprocs=2, join=True)
        got = [out[0], out[1]]
    s = 8.0**0.5
    torch.testing.assert_close(got[0], torch.tensor([[-3 / s, -2 / s, -1 / s]]))
    torch.testing.assert_close(got[1], torch.tensor([[1 / s, 5 / s, 0.0]]))
    # each rank on its own would have used its own mean (2 and 7): other numbers
    alone = whiten(VALUES[1], MASKS[1])
    assert not torch.allclose(alone, got[1])
