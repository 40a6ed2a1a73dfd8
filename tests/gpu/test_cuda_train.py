"""One bf16 training step on CUDA (drgrpo, ppo): the model, the update and the metrics live on
the GPU, every metric is finite, and repeated passes over the step's batch lower the loss."""

from __future__ import annotations

import math
import time

import pytest
import torch
from tests.gpu.support import DEVICE, cuda_config

from rlvr.training.trainer import Trainer

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("objective", ["drgrpo", "ppo"])
def test_a_bf16_step_trains_on_the_gpu_and_lowers_the_loss(objective, tiny_model_dir, tmp_path):
    """Four epochs over one batch, one micro-batch each (lr 1e-3): the objective's loss is
    recorded at every pass; it must fall from the first pass to the last (the surrogate moves
    the ratio towards the advantages; PPO's value loss fits the same returns again)."""
    torch.manual_seed(0)
    trainer = Trainer(
        cuda_config(
            tiny_model_dir,
            tmp_path,
            f"algo.objective={objective}",
            "algo.group_size=4",
            "algo.prompts_per_step=4",
            "algo.micro_batch_size=16",
            "algo.epochs_per_batch=4",
            "train.lr=1e-3",
        )
    )
    losses: list[float] = []
    loss = trainer.run.objective.loss

    def recorded(micro, counts):
        out, stats = loss(micro, counts)
        losses.append(float(out.detach()))
        return out, stats

    try:
        assert next(trainer.model.parameters()).device.type == DEVICE
        assert trainer.run.autocast  # bf16 autocast on the GPU
        trainer.run.objective.loss = recorded
        metrics = trainer.train_step()
    finally:
        trainer.run.close()
    assert len(losses) == 4, losses  # one micro-batch per epoch
    assert all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0], losses
    bad = {k: v for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)}
    assert not bad, bad
    assert metrics["nonfinite_skipped"] == 0.0
    assert metrics["grad_norm"] > 0
    assert metrics["optimizer_steps"] == 4.0


def test_the_update_time_waits_for_the_optimizer_steps_kernels(tiny_model_dir, tmp_path):
    """CUDA runs asynchronously: a phase clock read as soon as the optimizer step is queued
    leaves its kernels to the next phase. A GPU-side sleep of about 1 s queued after every
    optimizer step must count in ``time_update`` (the benchmark's update MFU divides by it); the
    bound is half that, since the card's clock (what ``_sleep`` counts) may move between the
    calibration and the step. Without the sleep this model's update takes well under 0.1 s."""
    torch.manual_seed(0)
    trainer = Trainer(
        cuda_config(tiny_model_dir, tmp_path, "algo.group_size=4", "algo.prompts_per_step=2")
    )
    # torch.cuda._sleep spins for a number of GPU cycles: cycles for 1 s, calibrated here (after
    # a first call, so the clock has left idle)
    torch.cuda._sleep(10**7)
    torch.cuda.synchronize()
    t = time.perf_counter()
    torch.cuda._sleep(10**8)
    torch.cuda.synchronize()
    cycles = int(10**8 * 1.0 / (time.perf_counter() - t))
    opt = trainer.state.optimizer
    step = opt.step

    def step_then_sleep(*args, **kwargs):
        out = step(*args, **kwargs)
        torch.cuda._sleep(cycles)
        return out

    try:
        opt.step = step_then_sleep
        metrics = trainer.train_step()
    finally:
        trainer.run.close()
    assert metrics["optimizer_steps"] == 1.0
    assert metrics["time_update"] >= 0.5, metrics["time_update"]
