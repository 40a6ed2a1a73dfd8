"""Small training runs on the tiny random model, and readers for what a run leaves on disk."""

from __future__ import annotations

import json
from pathlib import Path

import torch

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
