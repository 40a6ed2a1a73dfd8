"""FSDP2 on one process with NCCL, and a sharded (DCP) checkpoint of CUDA tensors written and
restored bitwise (weights, AdamW moments, and the step after it): fsdp_dcp_worker.py under
torchrun with real processes."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.gpu.support import DEVICE

pytestmark = pytest.mark.gpu

WORKER = Path(__file__).with_name("fsdp_dcp_worker.py")
# the torchrun job's own cap: below the cap of whatever runs this test (benchmarks/gpu/run.sh
# sets it 20 s under its stage's), so a hang fails here with the job's output, not killed silently
TIMEOUT_S = float(os.environ.get("RLVR_FSDP_TIMEOUT_S", "100"))


def test_fsdp2_with_nccl_and_a_dcp_checkpoint_resumed_bitwise(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "1",
        str(WORKER),
        str(tmp_path),
        DEVICE,
    ]
    # deterministic cuBLAS: the step after the restore must be the original's bitwise; NCCL's
    # warnings in the output: a failing communicator says why there, and the call is one chance
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    env.setdefault("NCCL_DEBUG", "WARN")
    # its own session: past the cap the whole job goes (torchrun and its rank), not torchrun alone
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the torchrun job ran past {TIMEOUT_S:.0f} s:\n{out[-3000:]}")
    assert proc.returncode == 0, out[-6000:]
    r = json.loads((tmp_path / "result.json").read_text())
    # rlvr's group: NCCL for CUDA tensors and gloo for CPU ones (the checkpoint's flag is one)
    assert ("nccl" in r["backend"]) == (DEVICE == "cuda")
    assert r["cpu_tensor_reduced"] == 1.0
    assert r["dtensor_params"]  # fully_shard really wrapped every parameter
    assert math.isfinite(r["loss_sharded"])
    # one rank: the all-gathers are copies, the arithmetic the plain model's (bf16 autocast)
    assert r["loss_sharded"] == pytest.approx(r["loss_plain"], rel=1e-3)
    assert r["max_weight_diff_vs_plain"] < 1e-5  # AdamW moves each weight by ~lr = 1e-3
    assert r["is_sharded"] and r["step_restored"] == 1
    assert r["weights_bitwise"] and r["optimizer_bitwise"] and r["next_step_bitwise"]
