"""What the GPU tests share: the device they run on and a tiny-run config for it."""

from __future__ import annotations

from pathlib import Path

from rlvr.config import load_config

# Every test here runs on this device; without CUDA they are skipped (conftest.py).
DEVICE = "cuda"


def cuda_config(model_dir: Path, out: Path, *overrides: str):
    """A short bf16 run of the tiny model on ``DEVICE`` (seed 0, no evaluations)."""
    return load_config(
        None,
        [
            f"model.name_or_path={model_dir}",
            f"model.device={DEVICE}",
            "model.autocast=bf16",
            f"train.output_dir={out}",
            "data.template=none",
            "rollout.max_new_tokens=16",
            "logging.progress=false",
            "eval.before_after=false",
            "reward.specs=[{name: 'toy_rewards:count_sevens'}]",
            "train.max_steps=1",
            "train.seed=0",
            *overrides,
        ],
    )
