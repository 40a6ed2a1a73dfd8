"""Sharded (DCP) checkpoints under FSDP2 with real processes: torchrun with 2 CPU ranks (gloo).

A run SIGKILLed after its first sharded checkpoint and resumed (2 ranks again) ends with the same
weights and per-step metrics as an uninterrupted 2-rank run; a sharded checkpoint exports to one
full HF folder in one process (what `rlvr eval` and `rlvr merge` load).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from rlvr.eval.loading import resolve_source
from rlvr.training.checkpoint import checkpoints_dir, latest_checkpoint
from rlvr.training.checkpoint_dcp import export_full_model, is_sharded

MAX_STEPS = 4
COMPARED = ("reward_mean", "policy_loss", "grad_norm")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _args(model_dir: Path, out: Path, name: str) -> list[str]:
    return [
        f"model.name_or_path={model_dir}",
        f"train.output_dir={out}",
        f"train.run_name={name}",
        "data.template=none",
        "rollout.max_new_tokens=16",
        "logging.progress=false",
        "eval.before_after=false",
        "reward.specs=[{name: 'toy_rewards:count_sevens'}]",
        f"train.max_steps={MAX_STEPS}",
        "train.save_every=2",
        "train.max_checkpoints=2",
        "train.lr=1e-2",
        "algo.group_size=4",
        "algo.prompts_per_step=4",
        "algo.micro_batch_size=4",
        "rollout.seed_per_prompt=true",
        "model.autocast=off",
        "train.parallel=fsdp2",
        "train.threads=1",
    ]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _run(cmd: list[str], cwd: Path) -> None:
    res = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def _steps(run_dir: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [m for m in lines if "reward_mean" in m]


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    assert out, f"no weights in {folder}"
    return out


def test_sigkill_then_resume_two_ranks_is_exact(tiny_model_dir, tmp_path):
    cmd = [*TORCHRUN, "-m", "rlvr", "train"]
    _run([*cmd, *_args(tiny_model_dir, tmp_path, "ref")], tmp_path)
    ref = tmp_path / "ref"
    ckpt = latest_checkpoint(ref)
    assert ckpt is not None and ckpt.step == MAX_STEPS and is_sharded(ckpt.path)
    # the DCP folder holds one shard file per rank
    assert len(list((ckpt.path / "dcp").glob("*.distcp"))) == 2

    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [*cmd, *_args(tiny_model_dir, tmp_path, "killed")],
        cwd=tmp_path,
        env=_env(),
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
    _run([*cmd, "--resume", str(killed)], tmp_path)

    got, want = _steps(killed), _steps(ref)
    assert [m["step"] for m in got] == list(range(1, MAX_STEPS + 1))
    for g, w in zip(got, want, strict=True):
        for key in COMPARED:  # same world size, same reduction order: bitwise
            assert g[key] == w[key], (g["step"], key, g[key], w[key])
    a, b = _weights(killed / "final"), _weights(ref / "final")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    base = _weights(tiny_model_dir)
    assert max(float((b[k] - base[k]).abs().max()) for k in b if k in base) > 1e-3
    assert sorted(p.name for p in checkpoints_dir(killed).iterdir()) == [
        "step_000002",
        "step_000004",
    ]

    # 2 -> 1: the sharded checkpoint of the last step exports to the final weights, in this process
    full = export_full_model(ckpt.path, tmp_path / "exported")
    c = _weights(full)
    for key in b:
        assert torch.equal(c[key], b[key]), key
    assert (full / "config.json").exists()
    # `rlvr eval` resolves the checkpoint folder to its exported full model ...
    source = resolve_source(str(ckpt.path))
    assert Path(source.model) == ckpt.path / "full_model" and source.run_dir == ref
    assert not source.is_adapter
    for key, value in _weights(Path(source.model)).items():
        assert torch.equal(value, b[key]), key
    # ... and `rlvr merge` writes it as one HF model
    _run([sys.executable, "-m", "rlvr", "merge", str(ckpt.path), "--out", "merged"], tmp_path)
    for key, value in _weights(tmp_path / "merged").items():
        assert torch.equal(value, b[key]), key
