"""Multi-process training with real processes: torchrun with 2 CPU ranks (gloo) against 1 process.

Same global batch, same seed, per-prompt sampling seeds: both runs draw the same completions, so
after a few steps the weights must agree up to float32 summation order (tolerance below).
"""

from __future__ import annotations

import pytest
from dist_support import ONE, TORCHRUN, run, steps, train_args, weights
from safetensors.torch import load_file

# Two ranks sum gradients in another order than one process: float32 round-off, a few ulps per
# step, stays far below 1e-5 on weights of size ~0.02 after 3 Adam steps at lr 1e-2.
ATOL = 1e-5


@pytest.mark.parametrize("parallel", ["fsdp2", "ddp"])
def test_two_ranks_match_one_process(tiny_model_dir, tmp_path, parallel):
    def args(name: str) -> list[str]:
        return train_args(tiny_model_dir, tmp_path, name, 3, f"train.parallel={parallel}")

    run(ONE, args("one"), tmp_path)
    run(TORCHRUN, args("two"), tmp_path)
    one, two = tmp_path / "one", tmp_path / "two"
    s1, s2 = steps(one), steps(two)
    # metrics are logged once (by rank 0), one line per step, over the whole global batch
    assert [m["step"] for m in s2] == [1, 2, 3]
    for a, b in zip(s1, s2, strict=True):
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-6)
        assert a["response_len_mean"] == b["response_len_mean"]
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    w1, w2 = weights(one / "final"), weights(two / "final")
    assert w1.keys() == w2.keys()
    worst = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    assert worst < ATOL, f"max weight difference {worst}"
    # and training did move the weights (the comparison is not between two untouched models)
    base = load_file(sorted(tiny_model_dir.glob("*.safetensors"))[0])
    moved = max(float((w1[k] - base[k]).abs().max()) for k in w1 if k in base)
    assert moved > 1e-3


def test_vllm_is_allowed_with_several_processes_when_tp_divides_them():
    from rlvr.config import load_config
    from rlvr.distributed import DistInfo
    from rlvr.training.preflight.checks import distributed_problems

    two = DistInfo(rank=0, world_size=2)
    ok = load_config(None, ["rollout.engine=vllm", "algo.prompts_per_step=4"])
    assert distributed_problems(ok, two) == []
    ok.rollout.tensor_parallel_size = 2  # both ranks share one engine
    assert distributed_problems(ok, two) == []
    bad = load_config(None, ["rollout.engine=vllm", "rollout.tensor_parallel_size=4"])
    assert distributed_problems(bad, two) == [
        "rollout.tensor_parallel_size=4 must divide the number of processes (2): each group of "
        "that many ranks shares one vLLM engine"
    ]


def test_a_gpu_group_also_carries_cpu_tensors(monkeypatch):
    """With CUDA the process group was NCCL alone, which takes CUDA tensors only ("No backend
    type associated with device type cpu"): the sharded checkpoint's agreement flag and every
    float reduction (``all_reduce_sum``) are CPU tensors, so several-GPU training failed at
    its first checkpoint. The group serves both devices: gloo for CPU tensors, NCCL for CUDA."""
    import torch
    import torch.distributed as dist

    from rlvr import distributed

    asked: list = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: asked.append(("device", i)))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend: asked.append(backend))
    info = distributed.init_distributed()
    assert (info.rank, info.world_size, info.local_rank) == (1, 2, 1)
    assert asked == [("device", 1), "cpu:gloo,cuda:nccl"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    asked.clear()
    distributed.init_distributed()
    assert asked == ["gloo"]
