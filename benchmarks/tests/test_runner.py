"""The turn-taking logic, then the real rlvr worker driven through the real protocol."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

import pytest
import torch

from benchmarks.harness.runner import REPO, Worker, alternate, block_order, worker_env
from benchmarks.harness.worker_rlvr import config_overrides
from benchmarks.harness.workloads import get_workload, prompt_digest, step_schedule


def test_block_order_is_abba():
    assert [block_order(["a", "b"], r) for r in range(3)] == [["a", "b"], ["b", "a"], ["a", "b"]]
    # three sides: ABC CBA ABC, so every side is first and last in turn
    assert [block_order(["a", "b", "c"], r) for r in range(3)] == [
        ["a", "b", "c"],
        ["c", "b", "a"],
        ["a", "b", "c"],
    ]


@dataclass
class FakeWorker:
    side: str
    rewards: list[float]
    calls: list = field(default_factory=list)
    steps: list = field(default_factory=list)
    finished: bool = False

    def run_block(self, k, timeout_s):
        self.calls.append(k)
        for _ in range(k):
            self.steps.append({"wall_s": 1.0, "reward_mean": self.rewards[len(self.steps)]})

    def close(self):
        self.finished = True


def test_alternate_runs_every_side_to_the_cap():
    order = []
    a, b = FakeWorker("a", [0.0] * 5), FakeWorker("b", [0.0] * 5)
    for w in (a, b):
        w.run_block = _recording(w.run_block, order, w.side)
    alternate({"a": a, "b": b}, steps=5, block=2, target=None, window=3, block_timeout_s=1, log=str)
    # blocks of 2, 2, then the 1 step left; turns in ABBA order
    assert a.calls == [2, 2, 1] and b.calls == [2, 2, 1]
    assert order == ["a", "b", "b", "a", "a", "b"]


def test_alternate_stops_a_side_at_its_target():
    # a: 3-step mean first reaches 0.9 at step 3 (1, 1, 1); b never does
    a, b = FakeWorker("a", [1.0] * 6), FakeWorker("b", [0.0] * 6)
    alternate({"a": a, "b": b}, steps=6, block=3, target=0.9, window=3, block_timeout_s=1, log=str)
    assert len(a.steps) == 3 and a.finished
    assert len(b.steps) == 6


def _recording(fn, order, side):
    def run(k, timeout_s):
        order.append(side)
        fn(k, timeout_s)

    return run


def test_worker_config_is_valid_rlvr_config():
    from rlvr.config import load_config
    from rlvr.objectives import build_objective

    spec = {
        "model_dir": "/m",
        "group_size": 8,
        "prompts_per_step": 2,
        "micro_batch": 8,
        "max_new_tokens": 64,
        "lr": 2e-5,
        "steps": 4,
        "seed": 3,
        "threads": 2,
    }
    cfg = load_config(None, config_overrides(spec))
    assert (cfg.algo.objective, cfg.algo.beta, cfg.algo.epochs_per_batch) == ("drgrpo", 0.0, 1)
    assert (
        build_objective(cfg).agg_mode == "seq_mean_token_sum_norm"
    )  # Dr.GRPO = TRL's loss_type dr_grpo
    assert (cfg.train.lr, cfg.train.schedule, cfg.train.seed) == (2e-5, "constant", 3)
    assert (cfg.model.autocast, cfg.model.dtype, cfg.rollout.max_new_tokens) == (
        "bf16",
        "float32",
        64,
    )
    assert cfg.rollout.engine == "hf"  # a spec without "engine" (the rlvr side)
    vllm_cfg = load_config(None, config_overrides({**spec, "engine": "vllm"}))
    assert vllm_cfg.rollout.engine == "vllm"
    # only the engine differs between the two rlvr sides
    assert vllm_cfg.model_dump() == {**cfg.model_dump(), "rollout": vllm_cfg.rollout.model_dump()}
    assert {**vllm_cfg.rollout.model_dump(), "engine": "hf"} == cfg.rollout.model_dump()
    with pytest.raises(ValueError, match="engine='sglang'"):
        config_overrides({**spec, "engine": "sglang"})


def test_rlvr_config_follows_the_spec_precision():
    """A float32 benchmark (a CPU without a bf16 fast path) turns autocast off, and the vLLM
    engine then computes in float32 too; an unknown precision names itself."""
    from rlvr.config import load_config
    from rlvr.rollout.vllm_setup import engine_dtype

    spec = get_workload("quick").worker_spec("/m", seed=0, threads=1, steps=1)
    f32 = load_config(None, config_overrides({**spec, "precision": "float32", "engine": "vllm"}))
    assert (f32.model.autocast, f32.model.dtype) == ("off", "float32")
    assert engine_dtype(f32, "cpu") == torch.float32
    bf16 = load_config(None, config_overrides({**spec, "precision": "bf16", "engine": "vllm"}))
    assert bf16.model.autocast == "bf16" and engine_dtype(bf16, "cpu") == torch.bfloat16
    with pytest.raises(ValueError, match="precision='fp8'"):
        config_overrides({**spec, "precision": "fp8"})


def test_rlvr_worker_end_to_end(tmp_path):
    """The rlvr worker on a tiny model: two blocks of one step, then stop."""
    from rlvr.training.tiny import build_char_tokenizer, save_tiny_model

    model_dir = save_tiny_model(tmp_path / "model")
    w = get_workload("quick")
    schedule = step_schedule(w, 2, build_char_tokenizer(), seed=0)
    spec = {
        "model_dir": str(model_dir),
        "prompts_per_step": w.prompts_per_step,
        "group_size": w.group_size,
        "max_new_tokens": 8,
        "micro_batch": w.micro_batch,
        "lr": w.lr,
        "steps": 2,
        "seed": 0,
        "threads": 1,
        "work_dir": str(tmp_path / "work"),
        "schedule": schedule,
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    argv = [sys.executable, "-m", "benchmarks.harness.worker_rlvr", str(tmp_path / "spec.json")]
    worker = Worker("rlvr", argv, worker_env(1, [REPO]), tmp_path / "rlvr.log").start()
    try:
        ready = worker.wait_ready(timeout_s=120)
        worker.run_block(1, timeout_s=120)
        assert len(worker.steps) == 1
        worker.run_block(1, timeout_s=120)
    finally:
        worker.close()
    assert worker.proc.returncode == 0, (tmp_path / "rlvr.log").read_text()
    assert ready["threads"] == 1 and ready["total_params"] > ready["nonembed_params"] > 0
    assert (ready["side"], ready["engine"]) == ("rlvr", "hf")
    assert [r["prompt_digest"] for r in worker.steps] == [
        prompt_digest([r["prompt"] for r in step]) for step in schedule
    ]
    for rec in worker.steps:
        assert rec["sequences"] == 8  # 2 prompts x 4 samples
        assert 0 < rec["completion_tokens"] <= 8 * 8  # at most 8 new tokens each
        assert rec["prompt_tokens"] == sum(rec["prompt_lens"]) * 4
        assert set(rec["phases"]) == {"generate", "reward", "logprob", "update", "sync"}
        assert rec["wall_s"] >= rec["phases"]["generate"] + rec["phases"]["update"]
        assert 0.0 <= rec["reward_mean"] <= 1.0
    assert worker.done["maxrss_self_mb"] > 0
    assert worker.rss.peak > 0
    # the worker stopped before the final save: no model was written
    assert not (tmp_path / "work" / "rlvr-run" / "final").exists()


@pytest.mark.slow
def test_quick_benchmark_both_sides(tmp_path):
    """The whole runner with TRL (creates benchmarks/.venv-trl on first use: minutes)."""
    from benchmarks.step import main

    argv = ["--workload", "quick", "--steps", "3", "--warmup", "1"]
    argv += ["--sides", "rlvr,trl,trl-whole"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    (js,) = tmp_path.glob("*-quick.json")
    payload = json.loads(js.read_text())
    assert payload["prompts_match"] is True
    assert "(TRL, whole batch: 8)" in js.with_suffix(".md").read_text()
    for side in ("rlvr", "trl", "trl-whole"):
        res = payload["sides"][side]
        assert len(res["steps"]) == 3 and res["summary"]["measured_steps"] == 2
        assert res["ready"]["total_params"] == payload["sides"]["rlvr"]["ready"]["total_params"]
    assert payload["sides"]["trl"]["ready"]["versions"]["trl"] == "1.16.0"


@pytest.mark.slow
def test_trl_trains_without_gradient_checkpointing_as_rlvr_does(tmp_path):
    """Equal work: TRL's configs turn gradient checkpointing on by default, so the ``trl`` side
    recomputed every forward in its update while rlvr keeps its activations. Each side reports
    what its model really ran with; ``trl-gc`` is TRL's default, measured beside it."""
    from benchmarks.step import main

    argv = ["--workload", "quick", "--steps", "2", "--warmup", "1"]
    argv += ["--sides", "rlvr,trl,trl-gc", "--out", str(tmp_path)]
    assert main(argv) == 0
    (js,) = tmp_path.glob("*-quick.json")
    sides = json.loads(js.read_text())["sides"]
    flags = {s: sides[s]["ready"]["activation_checkpointing"] for s in ("rlvr", "trl", "trl-gc")}
    assert flags == {"rlvr": False, "trl": False, "trl-gc": True}
    assert "TRL, gradient checkpointing" in js.with_suffix(".md").read_text()
