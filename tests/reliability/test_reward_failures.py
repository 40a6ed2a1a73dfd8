"""Rewards that raise, hang, return NaN / inf / None or the wrong type, in a real tiny training run:
the steps complete, the failed samples are left out of the loss and counted, and the run stops
with a clear message only when a step's failures exceed ``reward.max_failure_fraction``.

The data file decides which prompts fail: each row's answer names the fault that
``hostile_rewards.by_reference`` injects for it, and every step draws all rows, so each step
has exactly the same failures whatever the model generates.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import rlvr.objectives.base as objective_base
from reliability.figures import add, record
from reliability.hostile_rewards import FAULT_MODES
from reliability.runs import read_status, step_metrics, tiny_config
from rlvr.objectives.base import Objective
from rlvr.rewards.runner import RewardFailureError, RewardRunner
from rlvr.telemetry.samples import read_samples
from rlvr.training.trainer import Trainer

GROUP = 2
MODES = ["ok", "ok", "ok", *FAULT_MODES]  # 3 good prompts and the 7 faults: 10 rows
# 7 of 10 prompts fail, each with its 2 samples: 14 of 20 completions per step, a rate of 0.7.
FAILED_PER_STEP = len(FAULT_MODES) * GROUP
SAMPLES_PER_STEP = len(MODES) * GROUP
STEPS = 2


def write_rows(path: Path) -> Path:
    path.write_text(
        "".join(json.dumps({"prompt": f"q{i}", "answer": m}) + "\n" for i, m in enumerate(MODES))
    )
    return path


def faulty_config(model_dir: Path, out: Path, name: str, max_failure_fraction: float):
    data = write_rows(out / "modes.jsonl")
    return tiny_config(
        model_dir,
        out,
        name,
        "data.task=file",
        f"data.train_path={data}",
        f"algo.prompts_per_step={len(MODES)}",
        f"algo.group_size={GROUP}",
        f"algo.micro_batch_size={SAMPLES_PER_STEP}",  # one micro-batch per step
        "reward.specs=[{name: 'reliability.hostile_rewards:by_reference'}]",
        "reward.timeout_s=1.0",  # a hang costs one second
        f"reward.max_failure_fraction={max_failure_fraction}",
        f"train.max_steps={STEPS}",
        "logging.samples_every=1",
    )


def test_failed_samples_are_excluded_and_counted_and_the_run_goes_on(
    tiny_model_dir, tmp_path, monkeypatch, restore_threads
) -> None:
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    orders: list[list[int]] = []  # batch index of each micro-batch row (rows go by length)
    real_loss = Objective.loss
    real_micro_batches = objective_base.length_micro_batches

    def spying_loss(self, mb, counts):
        seen.append((mb.mask.detach().clone(), mb.advantages.detach().clone()))
        return real_loss(self, mb, counts)

    def spying_micro_batches(*args, **kwargs):
        out = real_micro_batches(*args, **kwargs)
        orders.extend(out)
        return out

    monkeypatch.setattr(Objective, "loss", spying_loss)
    monkeypatch.setattr(objective_base, "length_micro_batches", spying_micro_batches)
    # 0.7 of 20 is 14: exactly the failures of each step, which is not *above* the limit.
    cfg = faulty_config(tiny_model_dir, tmp_path, "faulty", max_failure_fraction=0.7)
    run_dir = Path(Trainer(cfg).fit()["run_dir"])

    assert read_status(run_dir)["state"] == "finished"
    lines = step_metrics(run_dir)
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["reward_failures"] == FAILED_PER_STEP  # 7 faulty prompts x 2 samples
        assert m["reward_failure_rate"] == pytest.approx(0.7)  # 14 / 20
        assert m["nonfinite_skipped"] == 0.0
        assert math.isfinite(m["policy_loss"]) and math.isfinite(m["reward_mean"])
    assert len(seen) == len(orders) == STEPS  # one micro-batch per step
    for step, ((mask_rows, adv_rows), order) in enumerate(zip(seen, orders, strict=True), start=1):
        samples = read_samples(run_dir, step)
        assert len(samples) == SAMPLES_PER_STEP == mask_rows.shape[0]
        assert sorted(order) == list(range(SAMPLES_PER_STEP))
        mask, adv = torch.zeros_like(mask_rows), torch.zeros_like(adv_rows)
        mask[order], adv[order] = mask_rows, adv_rows  # back to batch order
        for i, s in enumerate(samples):
            assert s["valid"] == (s["reference"] == "ok"), s
            if not s["valid"]:
                # left out of the loss: no token counts, zero advantage, reward recorded as 0
                assert mask[i].sum() == 0 and adv[i] == 0 and s["reward"] == 0.0
        # Dr.GRPO on the valid groups: advantage = reward - mean reward of the prompt's group
        for g in range(0, SAMPLES_PER_STEP, GROUP):
            group = samples[g : g + GROUP]
            if all(s["valid"] for s in group):
                mean = sum(s["reward"] for s in group) / GROUP
                for j, s in enumerate(group):
                    assert adv[g + j].item() == pytest.approx(s["reward"] - mean, abs=1e-6)
    add(
        "reward_failures",
        failures_injected=FAILED_PER_STEP * STEPS,
        failures_contained=sum(int(m["reward_failures"]) for m in lines),
        steps_completed=len(lines),
    )
    record("reward_failures", fault_modes=list(FAULT_MODES), failure_rate_tolerated=0.7)


def test_above_the_limit_the_run_stops_with_a_clear_message(
    tiny_model_dir, tmp_path, restore_threads
) -> None:
    # 0.65 of 20 is 13 failures allowed; every step has 14.
    cfg = faulty_config(tiny_model_dir, tmp_path, "too-faulty", max_failure_fraction=0.65)
    trainer = Trainer(cfg)
    with pytest.raises(RewardFailureError) as caught:
        trainer.fit()
    message = str(caught.value)
    assert "14 of 20 completions could not be scored" in message
    assert "reward.max_failure_fraction=0.65" in message  # the knob by its config name
    assert "by_reference" in message  # names the reward
    status = read_status(trainer.run.run_dir)
    assert status["state"] == "failed" and "could not be scored" in status["error"]
    assert step_metrics(trainer.run.run_dir) == []  # stopped in step 1, nothing logged as trained
    add("reward_failures", runs_stopped_above_limit=1)


@settings(max_examples=60, deadline=None)
@given(
    percent=st.integers(min_value=0, max_value=100),
    count=st.integers(min_value=1, max_value=200),
    data=st.data(),
)
@example(percent=70, count=90, data=None)  # 0.7 * 90 = 62.99999999999999 in floating point
@example(percent=35, count=180, data=None)
def test_a_batch_stops_exactly_when_its_failures_exceed_the_fraction(percent, count, data) -> None:
    """A batch of ``count`` with ``failed`` bad samples stops iff failed > fraction * count,
    computed exactly (fraction = percent / 100). The Countdown built-in raises KeyError for a row
    without ``numbers``, so the failing samples are chosen by their rows, in process."""
    fraction = percent / 100
    limit = Fraction(percent, 100) * count
    if data is None:  # the explicit examples: exactly at the limit, which must not stop
        failed = int(limit)
    else:
        failed = data.draw(st.integers(min_value=0, max_value=count))
    rows = [{} if i < failed else {"numbers": [1, 2], "target": 3} for i in range(count)]
    args = (["q"] * count, ["<answer>1+2</answer>"] * count, [""] * count, rows, [False] * count)
    with RewardRunner([{"name": "countdown"}], max_failure_fraction=fraction) as runner:
        if failed > limit:
            with pytest.raises(RewardFailureError, match=f"{failed} of {count} completions"):
                runner.score_batch(*args)
        else:
            batch = runner.score_batch(*args)
            assert batch.valid == [False] * failed + [True] * (count - failed)
            assert batch.scores[failed:] == [1.0] * (count - failed)  # 1 + 2 = 3 is right
