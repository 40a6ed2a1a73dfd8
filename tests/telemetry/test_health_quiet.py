"""The quiet-failure health rules on scripted metric streams (fires at exactly the step worked out
in the comments, not one earlier), and one planted fault in a real tiny run.

Streams go through ``run`` of test_health_gate: warm-up 2, window 3, so steps 0 and 1 are never
checked; every other metric is the healthy default there.
"""

from __future__ import annotations

import json

import pytest
from test_health_gate import fired, run


def _stream(key: str, values: list[float | None], **other: list) -> list[dict]:
    rows = [{}, {}]  # the two warm-up steps
    for i, v in enumerate(values):
        row = {key: v}
        for k, vs in other.items():
            row[k] = vs[i]
        rows.append(row)
    return rows


def test_entropy_floor_and_fast_fall() -> None:
    # step 2: 1.0 (no history); step 3: 0.01 < floor 0.02
    assert fired(run(_stream("entropy_mean", [1.0, 0.01]))) == [("entropy_collapse", "warn", 3)]
    # window 3: at step 5 the previous three were 2.0, 1.0, 0.5; 0.19 < (1 - 0.9) x 2.0 = 0.2
    falling = [2.0, 1.0, 0.5, 0.19]
    assert fired(run(_stream("entropy_mean", falling))) == [("entropy_collapse", "warn", 5)]
    assert run(_stream("entropy_mean", [2.0, 1.0, 0.5, 0.21])) == []  # 0.21 > 0.2
    # a slow decline: at step 6 the window holds 1.0, 0.5, 0.4, so 0.19 is not a 90% fall
    assert run(_stream("entropy_mean", [2.0, 1.0, 0.5, 0.4, 0.19])) == []


def test_length_collapse_needs_the_reward_not_to_improve() -> None:
    lengths = [40.0, 20.0, 9.0]  # baseline 40 at step 2; 9 < (1 - 0.75) x 40 = 10 at step 4
    stuck = [0.3, 0.31, 0.33]  # 0.33 < 0.3 + min_reward_gain 0.05: not an improvement
    events = run(_stream("response_len_p50", lengths, reward_mean=stuck))
    assert fired(events) == [("length_collapse", "warn", 4)]
    assert events[0].values["baseline_len"] == 40.0
    # shrinking with the reward falling is a collapse too
    falling = [0.3, 0.25, 0.2]
    assert fired(run(_stream("response_len_p50", lengths, reward_mean=falling))) == [
        ("length_collapse", "warn", 4)
    ]
    assert run(_stream("response_len_p50", [40.0, 20.0, 10.0], reward_mean=stuck)) == []


def test_replies_that_shrink_while_the_reward_rises_are_healthy() -> None:
    # the demo's shape: the model learns to answer directly, replies ~40 -> ~10 tokens while
    # the reward climbs from 0.3 to 0.9: no warning
    lengths = [40.0, 30.0, 20.0, 12.0, 9.0]
    rising = [0.3, 0.45, 0.6, 0.8, 0.9]
    assert run(_stream("response_len_p50", lengths, reward_mean=rising)) == []


def test_ratio_explosion_on_two_consecutive_steps_stops() -> None:
    # step 2: ratio 12 (run 1); step 3: back to 1.1 (run 0); 4: p99 6 (1); 5: ratio 11 (2)
    rows = _stream("ratio_max", [12.0, 1.1, 1.1, 11.0], log_ratio_abs_p99=[0.1, 0.1, 6.0, 0.1])
    assert fired(run(rows)) == [("ratio_explosion", "stop", 5)]


def test_kl_spike_against_the_running_median() -> None:
    # median of 0.010, 0.012, 0.011 is 0.011; 5 x 0.011 = 0.055 < 0.06 at step 5
    assert fired(run(_stream("kl", [0.010, 0.012, 0.011, 0.06]))) == [("kl_spike", "warn", 5)]
    assert run(_stream("kl", [0.010, 0.012, 0.011, 0.05])) == []
    # KL leaving 0 at the start of a run has no scale yet (median below min_kl 1e-3)
    assert run(_stream("kl", [0.0, 0.0, 0.0, 0.002])) == []


def test_three_growing_grad_spikes_stop_the_run() -> None:
    # running median 1; spikes (> 3) 4 at step 5, 5 at step 7, 6 at step 9: growing, within 10
    norms = [1.0, 1.0, 1.0, 4.0, 1.0, 5.0, 1.0, 6.0]
    assert fired(run(_stream("grad_norm", norms))) == [("grad_spikes", "stop", 9)]
    shrinking = [1.0, 1.0, 1.0, 4.0, 1.0, 5.0, 1.0, 4.5]  # 4.5 < 5: the sequence restarts
    assert run(_stream("grad_norm", shrinking)) == []
    # a healthy run starting to learn: small norms growing past 3x their median are no spikes
    # below health.grad_spikes.min_norm (1.0); the same shape above it is
    learning = [0.02, 0.02, 0.02, 0.07, 0.02, 0.09, 0.02, 0.3]
    assert run(_stream("grad_norm", learning)) == []
    assert fired(run(_stream("grad_norm", [x * 20 for x in learning]))) == [
        ("grad_spikes", "stop", 9)
    ]


def test_train_eval_divergence_over_two_evals() -> None:
    key = "eval/heldout/greedy_pass@1"
    rewards = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7]  # mean since the last eval: 0.25, 0.45, 0.65
    evals = [None, 0.5, None, 0.4, None, 0.3]  # evals at steps 3, 5 and 7

    def rows(ev):
        return [{}, {}] + [
            {"reward_mean": r, **({key: e} if e is not None else {})}
            for r, e in zip(rewards, ev, strict=True)
        ]

    events = run(rows(evals))
    assert fired(events) == [("train_eval_divergence", "warn", 7)]
    assert events[0].values["eval"] == [0.5, 0.4, 0.3]
    assert events[0].values["train_reward"] == pytest.approx([0.25, 0.45, 0.65])
    assert run(rows([None, 0.5, None, 0.4, None, 0.45])) == []  # the eval recovered


def test_planted_ratio_explosion_stops_a_real_run(tiny_model_dir, tmp_path) -> None:
    """lr 0.5 with two update passes per batch: after the first pass the policy is far from the
    one that sampled, so the second pass sees ratios of e^20 (the clamp). The gate stops the
    run at the first checked step and says why."""
    from reliability.runs import read_status, tiny_config
    from rlvr.telemetry import HealthStop
    from rlvr.training.trainer import Trainer

    cfg = tiny_config(
        tiny_model_dir, tmp_path, "planted", "train.lr=0.5", "algo.epochs_per_batch=2",
        "train.preflight_step=0", "train.max_steps=4", "eval.before_after=false",
        "health.warmup_steps=0", "health.ratio_explosion.steps=1",
    )  # fmt: skip
    with pytest.raises(HealthStop) as stop:
        Trainer(cfg).fit()
    assert stop.value.event.rule == "ratio_explosion" and stop.value.event.step == 1
    assert stop.value.event.values["ratio_max"] > 10
    health = json.loads((tmp_path / "planted" / "health.json").read_text())
    assert health["status"] == "stopped"
    assert health["stopped_by"]["rule"] == "ratio_explosion"
    assert read_status(tmp_path / "planted")["state"] == "stopped_by_health"
