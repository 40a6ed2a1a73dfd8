"""Every run shows its memory: per-step RSS (and CUDA) metrics, the plan beside the measured peak
in summary.json and the closing lines, the maximum over ranks, the warning naming the missing part.

The end-to-end runs plant a known growth in the trainer process (`memory_plant.py`: the scoring
phase holds a buffer that grows by a fixed size every step)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from dist_support import TORCHRUN, steps, train_args

from rlvr.distributed import DistInfo
from rlvr.rollout.vllm_setup import kv_cache_budget
from rlvr.telemetry import write_report
from rlvr.training.memory import GIB, WARN_OVER_PLAN, MemoryMeter, compare, memory_lines
from rlvr.training.preflight.memory_plan import OPTIMIZER_TERM, MemoryPlan

PLANT = Path(__file__).with_name("memory_plant.py")
MIB = 2**20


def _plant_run(launcher: list[str], args: list[str], cwd: Path, mib: int, ranks: str) -> str:
    """`rlvr train args` under ``launcher`` with ``mib`` MiB more held per step on ``ranks``;
    returns its stdout."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MEMORY_PLANT_MIB": str(mib),
        "MEMORY_PLANT_RANKS": ranks,
    }
    cmd = [*launcher, str(PLANT), "train", *args]
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


def test_memory_metrics_move_with_a_planted_growth_and_the_summary_compares_with_the_plan(
    tiny_model_dir, tmp_path
):
    mib = 160
    out = _plant_run(
        [sys.executable], train_args(tiny_model_dir, tmp_path, "one", 3), tmp_path, mib, "0"
    )
    run_dir = tmp_path / "one"
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    s = steps(run_dir)
    assert [m["step"] for m in s] == [1, 2, 3]
    for m in s:
        assert m["mem_rss_peak_gib"] >= m["mem_rss_gib"] > 0
        assert not any(k.endswith("_rank0") or k.startswith("mem_cuda") for k in m)  # 1 CPU process
    # the buffer held by the scoring phase grows by `mib` a step: current and peak RSS follow it
    grown = mib * MIB / GIB
    for a, b in zip(s, s[1:], strict=False):
        assert b["mem_rss_gib"] - a["mem_rss_gib"] == pytest.approx(grown, rel=0.1)
        assert b["mem_rss_peak_gib"] - a["mem_rss_peak_gib"] == pytest.approx(grown, rel=0.1)

    summary = json.loads((run_dir / "summary.json").read_text())
    plan, mem = summary["memory_plan"], summary["memory"]
    # the plan is written once, on the first metrics line, and is the one summary.json keeps
    assert lines[0]["mem_plan_gib"] == plan["peak_gib"] == mem["plan_peak_gib"]
    assert not any("mem_plan_gib" in m for m in lines[1:])
    assert plan["held"]["process baseline"] > 0 and plan["phases_add"] is True
    # the measured peak is the process's peak RSS at the end: at least the last step's
    assert mem["measured_peak_gib"] >= s[-1]["mem_rss_peak_gib"]
    assert mem["measure"] == "peak RSS"
    assert (
        mem["error"] == (mem["plan_peak_gib"] - mem["measured_peak_gib"]) / mem["measured_peak_gib"]
    )
    # the growth booked to scoring is the planted buffer (all of steps 2 and 3, most of step 1)
    assert 2 * grown < mem["growth_gib"]["reward"] < 3 * grown * 1.05

    # the closing lines print both numbers and an error that follows from them
    found = re.search(
        r"memory: measured peak ([\d.]+) GiB \(peak RSS\) against ([\d.]+) GiB planned before "
        r"the run: the plan is ([\d.]+)% (above|under) the measured peak",
        out,
    )
    assert found, out
    measured, planned, error = (float(g) for g in found.groups()[:3])
    error = error if found.group(4) == "above" else -error
    assert measured == pytest.approx(mem["measured_peak_gib"], abs=5e-4)
    assert error / 100 == pytest.approx((planned - measured) / measured, abs=1.5e-3)
    # the plan is a lower bound far under this run: the warning names the scoring phase
    assert mem["measured_peak_gib"] > (1 + WARN_OVER_PLAN) * mem["plan_peak_gib"]
    assert mem["likely_missing"] == "reward"
    assert (
        "memory warning: the measured peak is" in out and "the plan counts no reward memory" in out
    )

    # `rlvr report` draws the memory plot of this run
    report = write_report([run_dir], tmp_path / "report")
    assert (report.parent / "plots" / "memory.png").is_file()
    assert 'src="plots/memory.png"' in report.read_text()


def test_rank_maximum_over_two_gloo_processes(tiny_model_dir, tmp_path):
    """Only rank 1 holds the planted buffer: the plain keys are the larger rank's figures."""
    mib = 128
    args = train_args(tiny_model_dir, tmp_path, "two", 2, "train.parallel=ddp")
    out = _plant_run(TORCHRUN, args, tmp_path, mib, "1")
    s = steps(tmp_path / "two")
    assert [m["step"] for m in s] == [1, 2]
    for n, m in enumerate(s, start=1):
        for key in ("mem_rss_gib", "mem_rss_peak_gib"):
            assert m[key] == max(m[f"{key}_rank0"], m[f"{key}_rank1"])
        # rank 1 holds n x mib more than rank 0 (the ranks otherwise hold alike, within 64 MiB)
        held = m["mem_rss_gib_rank1"] - m["mem_rss_gib_rank0"]
        assert held == pytest.approx(n * mib * MIB / GIB, abs=64 * MIB / GIB)
        assert m["mem_rss_peak_gib"] == m["mem_rss_peak_gib_rank1"]
    mem = json.loads((tmp_path / "two" / "summary.json").read_text())["memory"]
    assert mem["measure"] == "peak RSS, max over 2 processes (rank 1)"
    assert mem["measured_peak_gib"] >= s[-1]["mem_rss_peak_gib_rank1"]
    assert "max over 2 processes (rank 1)" in out


def _plan(gib: dict[str, dict[str, float]]) -> MemoryPlan:
    terms = {k: {name: int(v * GIB) for name, v in t.items()} for k, t in gib.items()}
    return MemoryPlan(**terms, spec=SimpleNamespace(phases_add=True))


PLAN = {  # peak (CPU: the phases add) 1 + 1 + 0.5 + 0.5 + 0.25 = 3.25 GiB
    "resident": {"process baseline": 1.0, "weights": 1.0, OPTIMIZER_TERM: 0.5},
    "update": {"activations": 0.5},
    "rollout": {"generation KV cache (transformers)": 0.25},
}


def test_compare_by_hand():
    plan = _plan(PLAN)
    assert plan.peak == int(3.25 * GIB)
    assert plan.by_phase() == {"start": 2 * GIB, "rollout": GIB // 4, "update": GIB}
    # 4.5 GiB measured: 38% over 3.25 (> 25%); the update grew 2.0 against the plan's 1.0 (the
    # largest excess: start 2.1 - 2.0, rollout 0.3 - 0.25, reward 0.1 - 0)
    growth = {"start": 2.1, "rollout": 0.3, "reward": 0.1, "update": 2.0}
    measured = {"measured_peak_gib": 4.5, "measure": "peak RSS", "growth_gib": growth}
    mem = compare(plan, measured)
    assert mem["error"] == pytest.approx((3.25 - 4.5) / 4.5)  # -27.8%
    assert mem["likely_missing"] == "update"
    assert mem["warning"].startswith("the measured peak is 38% above the plan")
    assert "rose 1.000 GiB more in the part 'update' than the plan's terms" in mem["warning"]
    assert memory_lines(mem) == [
        "memory: measured peak 4.500 GiB (peak RSS) against 3.250 GiB planned before the run: "
        "the plan is 27.8% under the measured peak (the plan is a lower bound, within about 20% "
        "on the CPU; docs/memory-plan.md)",
        f"memory warning: {mem['warning']}",
    ]
    # a plan above the peak says why it may be (rows shorter than the limits it sizes for)
    over = memory_lines(compare(plan, {**measured, "measured_peak_gib": 1.625}))
    assert over[0] == (
        "memory: measured peak 1.625 GiB (peak RSS) against 3.250 GiB planned before the run: "
        "the plan is 100.0% above the measured peak (it sizes every row at "
        "data.max_prompt_tokens + rollout.max_new_tokens; shorter rows need less; "
        "docs/memory-plan.md)"
    )
    # 4.0 GiB is 23% over the plan: no warning; no plan: the measured peak alone
    under = compare(plan, {**measured, "measured_peak_gib": 4.0})
    assert under["warning"] is None and "likely_missing" not in under
    assert len(memory_lines(under)) == 1
    alone = memory_lines(compare(None, measured))
    assert alone == [
        "memory: measured peak 4.500 GiB (peak RSS); no memory plan (a model passed in, or its "
        "shape unreadable)"
    ]


def test_engine_kv_budget_is_reported():
    meter = MemoryMeter(
        torch.device("cpu"), DistInfo(), SimpleNamespace(kv_cache_bytes=3 * GIB // 2)
    )
    assert meter.end_step()["mem_engine_kv_gib"] == 1.5
    assert "mem_engine_kv_gib" not in MemoryMeter(torch.device("cpu"), DistInfo()).end_step()
    # vLLM on a GPU: its blocks x block size x bytes per token (2 layers x K,V x 2 heads x 8 dims
    # x 2 bytes = 128), split over 2 tensor-parallel ranks
    config = SimpleNamespace(
        num_attention_heads=4, num_key_value_heads=2, hidden_size=32, num_hidden_layers=2
    )
    cache = SimpleNamespace(num_gpu_blocks=100, block_size=16)
    llm = SimpleNamespace(
        llm_engine=SimpleNamespace(vllm_config=SimpleNamespace(cache_config=cache))
    )
    assert kv_cache_budget(llm, config, torch.bfloat16, 2) == 100 * 16 * 128 // 2
    cache.num_gpu_blocks = None  # not profiled: unknown
    assert kv_cache_budget(llm, config, torch.bfloat16, 1) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_peaks_are_per_step(tiny_model_dir, tmp_path, monkeypatch):
    """On a GPU the scoring phase of step 1 allocates 256 MiB and frees it, step 2's allocates 64
    MiB and keeps it, step 3's nothing: each step's max allocated is its own (reset at the step's
    start), allocated at the end what is still held."""
    from rlvr.config import load_config
    from rlvr.training.step import Step
    from rlvr.training.trainer import Trainer

    held: list[torch.Tensor] = []
    score = Step.score

    def planted(self, batch):
        if self.state.step == 0:  # 0-based: step 1
            torch.ones(256 * MIB, dtype=torch.uint8, device="cuda")  # freed at once
        elif self.state.step == 1:
            held.append(torch.ones(64 * MIB, dtype=torch.uint8, device="cuda"))
        return score(self, batch)

    monkeypatch.setattr(Step, "score", planted)
    args = train_args(tiny_model_dir, tmp_path, "gpu", 3, "model.device=cuda")
    summary = Trainer(load_config(None, args)).fit()
    s = steps(tmp_path / "gpu")
    assert [m["step"] for m in s] == [1, 2, 3]
    for m in s:
        assert m["mem_cuda_max_reserved_gib"] >= m["mem_cuda_max_allocated_gib"]
        assert m["mem_cuda_max_allocated_gib"] >= m["mem_cuda_allocated_gib"] > 0
    # step 1 peaked with 256 MiB more than it kept; step 3 (reset since) holds only the 64 MiB
    # kept by step 2 above it (the tiny model's own tensors are a few MiB)
    tol = 16 * MIB / GIB
    drop = s[0]["mem_cuda_max_allocated_gib"] - s[2]["mem_cuda_max_allocated_gib"]
    assert drop == pytest.approx((256 - 64) * MIB / GIB, abs=tol)
    kept = s[1]["mem_cuda_allocated_gib"] - s[0]["mem_cuda_allocated_gib"]
    assert kept == pytest.approx(64 * MIB / GIB, abs=tol / 4)
    mem = summary["memory"]
    assert mem["measure"] == "torch.cuda max reserved"
    assert mem["measured_peak_gib"] >= max(m["mem_cuda_max_reserved_gib"] for m in s)
    assert (
        mem["error"] == (mem["plan_peak_gib"] - mem["measured_peak_gib"]) / mem["measured_peak_gib"]
    )
