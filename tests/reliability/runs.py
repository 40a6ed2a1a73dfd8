"""Small training runs on the tiny random model, and readers for what a run leaves on disk."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from rlvr.config import Config, load_config
from rlvr.telemetry.sinks import read_metrics


def tiny_overrides(model_dir: Path, out: Path, name: str, *extra: str) -> list[str]:
    """A run of a few tenths of a second per step: tiny model, 8 new tokens, one torch thread
    (so CPU kernels reduce in one order and repeated runs agree bit for bit)."""
    return [
        f"model.name_or_path={model_dir}",
        f"train.output_dir={out}",
        f"train.run_name={name}",
        "data.template=none",
        "rollout.max_new_tokens=8",
        "logging.progress=false",
        "eval.max_problems=4",
        "reward.specs=[{name: 'toy_rewards:count_sevens'}]",
        "train.threads=1",
        "train.lr=1e-2",
        *extra,
    ]


def tiny_config(model_dir: Path, out: Path, name: str, *extra: str) -> Config:
    return load_config(None, tiny_overrides(model_dir, out, name, *extra))


# Metrics that legitimately differ between runs: wall-clock timings and rates.
# what the clock and the allocator measure (times, rates, memory): never equal between two runs
TIMING = ("time_", "_per_s", "mem_")


def deterministic(metrics: dict) -> dict:
    """A metrics line without its timings and memory figures: what two equal runs share bit for
    bit."""
    return {k: v for k, v in metrics.items() if not any(t in k for t in TIMING)}


def step_metrics(run_dir: Path) -> list[dict]:
    """Metrics lines of training steps (step 0 is the evaluation before training); "NaN" and
    "Infinity" markers read back as floats."""
    return [m for m in read_metrics(run_dir) if m["step"] > 0]


def read_status(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "status.json").read_text())


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every parameter, to compare bit for bit later."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def differing_bytes(a: Path, b: Path) -> int:
    """Bytes that differ between two files (a length difference counts as that many bytes)."""
    x, y = a.read_bytes(), b.read_bytes()
    return sum(p != q for p, q in zip(x, y, strict=False)) + abs(len(x) - len(y))


def assert_equal_to_reference(run_dir: Path, reference: Path, max_steps: int) -> int:
    """Same per-step metrics (timings aside) and the same final weights; returns bytes lost."""
    got, want = read_metrics(run_dir), read_metrics(reference)
    assert [m["step"] for m in got] == list(range(max_steps + 1))  # each step exactly once
    for g, w in zip(got, want, strict=True):
        assert deterministic(g) == deterministic(w), g["step"]
    a = load_file(str(run_dir / "final" / "model.safetensors"))
    b = load_file(str(reference / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert read_status(run_dir)["state"] == "finished"
    return differing_bytes(
        run_dir / "final" / "model.safetensors", reference / "final" / "model.safetensors"
    )
