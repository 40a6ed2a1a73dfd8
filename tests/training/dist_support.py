"""Helpers of the multi-process tests: launch `rlvr train` in one process or under torchrun
(2 CPU ranks, gloo), and read what a run wrote."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
ONE = [sys.executable]


def train_args(
    model_dir: Path, out: Path, name: str, steps: int, *extra: str, new_tokens: int = 8
) -> list[str]:
    """A tiny run: 4 prompts x 4 replies of ``new_tokens`` tokens a step, per-prompt sampling
    seeds (the replies do not depend on how prompts are split over ranks), no autocast, one
    thread."""
    return [
        f"model.name_or_path={model_dir}",
        f"train.output_dir={out}",
        f"train.run_name={name}",
        "data.template=none",
        f"rollout.max_new_tokens={new_tokens}",
        "logging.progress=false",
        "eval.before_after=false",
        "reward.specs=[{name: 'toy_rewards:count_sevens'}]",
        f"train.max_steps={steps}",
        "train.lr=1e-2",
        "algo.group_size=4",
        "algo.prompts_per_step=4",
        "algo.micro_batch_size=4",
        "rollout.seed_per_prompt=true",
        "model.autocast=off",
        "train.threads=1",
        *extra,
    ]


def run(launcher: list[str], args: list[str], cwd: Path) -> None:
    """``launcher -m rlvr train args`` (``ONE`` or ``TORCHRUN``); fails the test on an error."""
    run_command([*launcher, "-m", "rlvr", "train", *args], cwd)


def run_command(cmd: list[str], cwd: Path) -> None:
    """``cmd`` with one OpenMP thread per process; fails the test on an error."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def steps(run_dir: Path) -> list[dict]:
    """The per-step lines of ``metrics.jsonl``."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [m for m in lines if "reward_mean" in m]


def computed(m: dict) -> dict:
    """A step's metrics without what the clock and the allocator measure (times, throughputs,
    memory)."""
    return {
        k: v
        for k, v in m.items()
        if not k.startswith(("time_", "mem_")) and not k.endswith("_per_s")
    }


def weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor in the ``*.safetensors`` files of ``folder``."""
    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(f))
    assert out, f"no weights in {folder}"
    return out


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def rewind_to(src: Path, dst: Path, step: int) -> Path:
    """A copy of run ``src`` as a kill right after its checkpoint of ``step`` leaves it: later
    checkpoints and the final model gone (its metrics lines stay; the resume forgets them)."""
    shutil.copytree(src, dst)
    for ckpt in (dst / "checkpoints").glob("step_*"):
        if int(ckpt.name.split("_")[1]) > step:
            shutil.rmtree(ckpt)
    shutil.rmtree(dst / "final")
    return dst
