"""Multi-process training with real processes: torchrun with 2 CPU ranks (gloo) against 1 process.

Same global batch, same seed, per-prompt sampling seeds: both runs draw the same completions, so
after a few steps the weights must agree up to float32 summation order (tolerance below).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

# Two ranks sum gradients in another order than one process: float32 round-off, a few ulps per
# step, stays far below 1e-5 on weights of size ~0.02 after 3 Adam steps at lr 1e-2.
ATOL = 1e-5


def _args(model_dir: Path, out: Path, name: str, parallel: str) -> list[str]:
    return [
        f"model.name_or_path={model_dir}",
        f"train.output_dir={out}",
        f"train.run_name={name}",
        "data.template=none",
        "rollout.max_new_tokens=8",
        "logging.progress=false",
        "eval.before_after=false",
        "reward.specs=[{name: 'toy_rewards:count_sevens'}]",
        "train.max_steps=3",
        "train.lr=1e-2",
        "algo.group_size=4",
        "algo.prompts_per_step=4",
        "algo.micro_batch_size=4",
        "rollout.seed_per_prompt=true",
        "model.autocast=off",
        f"train.parallel={parallel}",
        "train.threads=1",
    ]


def _run(cmd: list[str], cwd: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    files = sorted((run_dir / "final").glob("*.safetensors"))
    assert files, f"no weights in {run_dir / 'final'}"
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(f))
    return out


def _steps(run_dir: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [m for m in lines if "reward_mean" in m]


@pytest.mark.parametrize("parallel", ["fsdp2", "ddp"])
def test_two_ranks_match_one_process(tiny_model_dir, tmp_path, parallel):
    _run(
        [sys.executable, "-m", "rlvr", "train", *_args(tiny_model_dir, tmp_path, "one", parallel)],
        tmp_path,
    )
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
    ]
    _run(
        [*torchrun, "-m", "rlvr", "train", *_args(tiny_model_dir, tmp_path, "two", parallel)],
        tmp_path,
    )
    one, two = tmp_path / "one", tmp_path / "two"
    s1, s2 = _steps(one), _steps(two)
    # metrics are logged once (by rank 0), one line per step, over the whole global batch
    assert [m["step"] for m in s2] == [1, 2, 3]
    for a, b in zip(s1, s2, strict=True):
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-6)
        assert a["response_len_mean"] == b["response_len_mean"]
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    w1, w2 = _weights(one), _weights(two)
    assert w1.keys() == w2.keys()
    worst = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    assert worst < ATOL, f"max weight difference {worst}"
    # and training did move the weights (the comparison is not between two untouched models)
    base = load_file(sorted(tiny_model_dir.glob("*.safetensors"))[0])
    moved = max(float((w1[k] - base[k]).abs().max()) for k in w1 if k in base)
    assert moved > 1e-3


def test_vllm_is_allowed_with_several_processes_when_tp_divides_them():
    from rlvr.config import load_config
    from rlvr.training.distributed import DistInfo
    from rlvr.training.run_setup import distributed_problems

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
