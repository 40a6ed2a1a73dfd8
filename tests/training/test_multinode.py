"""Two torchrun agents as two "nodes" (one rank each) meeting over a c10d rendezvous on
127.0.0.1: the multi-node launch of the README, run for real on one machine."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_torchrun_agents_as_two_nodes(tiny_model_dir, tmp_path):
    port = _free_port()
    args = [
        f"model.name_or_path={tiny_model_dir}",
        f"train.output_dir={tmp_path}",
        "train.run_name=two-nodes",
        "data.template=none",
        "rollout.max_new_tokens=8",
        "logging.progress=false",
        "eval.before_after=false",
        # rewards that vary inside every group of a random model's replies, so both steps have a
        # gradient whatever the sampler drew ('7's alone can be missing from a whole step)
        "reward.specs=[{name: 'toy_rewards:digit_fraction'}]",
        "train.max_steps=2",
        "algo.group_size=4",
        "algo.prompts_per_step=4",
        "algo.micro_batch_size=4",
        "model.autocast=off",
        "train.threads=1",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    agents = [
        subprocess.Popen(
            [
                *[sys.executable, "-m", "torch.distributed.run"],
                *["--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1"],
                *["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"],
                *["--rdzv-id", "rlvr-test", "--max-restarts", "0"],
                *["-m", "rlvr", "train", *args],
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = []
    for proc in agents:
        try:
            out, _ = proc.communicate(timeout=600)
        finally:
            proc.kill()
        outputs.append(out)
    for proc, out in zip(agents, outputs, strict=True):
        assert proc.returncode == 0, out[-3000:]
    run_dir = Path(tmp_path) / "two-nodes"
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "reward_mean" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["grad_norm"] > 0 for m in steps)
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"
    assert any((run_dir / "final").glob("*.safetensors"))
    # both nodes took part: the second rank kept its scratch copy of the run files
    assert (run_dir / "ranks" / "rank1").is_dir()
