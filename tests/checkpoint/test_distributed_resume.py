"""Sharded (DCP) checkpoints under FSDP2 with real processes: torchrun with 2 CPU ranks (gloo).

A run SIGKILLed after its first sharded checkpoint and resumed (2 ranks again) ends with the same
weights and per-step metrics as an uninterrupted 2-rank run; a sharded checkpoint exports to one
full HF folder in one process (what `rlvr eval` and `rlvr merge` load).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from tests.training.dist_support import TORCHRUN, run, run_command, steps, train_args, weights

from rlvr.checkpoint.full import checkpoints_dir, latest_checkpoint
from rlvr.checkpoint.sharded import export_full_model, is_sharded
from rlvr.eval.loading import resolve_source

MAX_STEPS = 4
COMPARED = ("reward_mean", "policy_loss", "grad_norm")


def _args(model_dir: Path, out: Path, name: str) -> list[str]:
    every = ["train.save_every=2", "train.max_checkpoints=2", "train.parallel=fsdp2"]
    return train_args(model_dir, out, name, MAX_STEPS, *every, new_tokens=16)


def test_sigkill_then_resume_two_ranks_is_exact(tiny_model_dir, tmp_path):
    cmd = [*TORCHRUN, "-m", "rlvr", "train"]
    run(TORCHRUN, _args(tiny_model_dir, tmp_path, "ref"), tmp_path)
    ref = tmp_path / "ref"
    ckpt = latest_checkpoint(ref)
    assert ckpt is not None and ckpt.step == MAX_STEPS and is_sharded(ckpt.path)
    # the DCP folder holds one shard file per rank
    assert len(list((ckpt.path / "dcp").glob("*.distcp"))) == 2

    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [*cmd, *_args(tiny_model_dir, tmp_path, "killed")],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while latest_checkpoint(killed) is None:
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "first checkpoint not written in time"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # the agent and both ranks, mid-run
    proc.wait()
    assert not (killed / "final").exists()
    assert latest_checkpoint(killed).step == 2
    run(TORCHRUN, ["--resume", str(killed)], tmp_path)

    got, want = steps(killed), steps(ref)
    assert [m["step"] for m in got] == list(range(1, MAX_STEPS + 1))
    for g, w in zip(got, want, strict=True):
        for key in COMPARED:  # same world size, same reduction order: bitwise
            assert g[key] == w[key], (g["step"], key, g[key], w[key])
    a, b = weights(killed / "final"), weights(ref / "final")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    base = weights(tiny_model_dir)
    assert max(float((b[k] - base[k]).abs().max()) for k in b if k in base) > 1e-3
    assert sorted(p.name for p in checkpoints_dir(killed).iterdir()) == [
        "step_000002",
        "step_000004",
    ]

    # 2 -> 1: the sharded checkpoint of the last step exports to the final weights, in this process
    full = export_full_model(ckpt.path, tmp_path / "exported")
    c = weights(full)
    for key in b:
        assert torch.equal(c[key], b[key]), key
    assert (full / "config.json").exists()
    # `rlvr eval` resolves the checkpoint folder to its exported full model ...
    source = resolve_source(str(ckpt.path))
    assert Path(source.model) == ckpt.path / "full_model" and source.run_dir == ref
    assert not source.is_adapter
    for key, value in weights(Path(source.model)).items():
        assert torch.equal(value, b[key]), key
    # ... and `rlvr merge` writes it as one HF model
    run_command(
        [sys.executable, "-m", "rlvr", "merge", str(ckpt.path), "--out", "merged"], tmp_path
    )
    for key, value in weights(tmp_path / "merged").items():
        assert torch.equal(value, b[key]), key
