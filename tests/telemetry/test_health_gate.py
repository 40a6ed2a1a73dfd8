"""The health gate on scripted metric streams, its config, and the health files."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from rlvr.telemetry import (
    HealthConfig,
    HealthEvent,
    HealthGate,
    HealthStop,
    first_stop,
    read_health,
    write_health,
)
from rlvr.telemetry.health import RULE_NAMES

# A step where every rule is satisfied.
HEALTHY = {
    "reward_mean": 0.4,
    "reward_std": 0.3,
    "has_boxed": 0.9,
    "grad_norm": 1.2,
    "adv_std": 0.8,
    "truncation_rate": 0.1,
    "clip_frac_low": 0.01,
    "clip_frac_high": 0.02,
    "logprob_diff_max": 0.3,
    "logprob_k3": 0.001,
    "nonfinite_skipped": 0.0,
    "policy_loss": 0.05,
}

# warm-up 2 and window 3 keep the streams short: steps 0 and 1 are never checked, and a
# "stuck" rule first fires at step 2 + 3 - 1 = 4.
SHORT = {"warmup_steps": 2, "window": 3}


def run(stream: Iterable[dict], **cfg: object) -> list[HealthEvent]:
    """Feed ``stream`` (one overrides-dict per step, starting at step 0) through a gate."""
    gate = HealthGate(HealthConfig.model_validate({**SHORT, **cfg}))
    events: list[HealthEvent] = []
    for step, overrides in enumerate(stream):
        metrics = {**HEALTHY, **overrides}
        metrics = {k: v for k, v in metrics.items() if v is not None}  # None = key missing
        events += gate.check(step, metrics)
    assert events == gate.events
    return events


def fired(events: list[HealthEvent]) -> list[tuple[str, str, int]]:
    return [(e.rule, e.action, e.step) for e in events]


def test_healthy_stream_with_default_config_is_silent() -> None:
    gate = HealthGate()
    assert all(gate.check(step, {**HEALTHY, "step": step}) == [] for step in range(40))


def test_reward_stuck_at_zero_stops_after_window() -> None:
    events = run([{"reward_mean": 0.0}] * 8)
    assert fired(events) == [("reward_stuck", "stop", 4)]
    assert events[0].values == {"reward_mean": 0.0, "stuck_at": 0.0, "steps": 3}
    assert "reward bug" in events[0].advice


def test_reward_stuck_at_one_gives_too_easy_advice() -> None:
    events = run([{"reward_mean": 1.0}] * 5)
    assert fired(events) == [("reward_stuck", "stop", 4)]
    assert events[0].values["stuck_at"] == 1.0
    assert "too easy" in events[0].advice


def test_reward_window_resets_when_the_condition_breaks() -> None:
    # checked steps: 2:0, 3:0, 4:0.5 (reset), 5:0, 6:0, 7:0 -> third in a row at step 7
    stream = [{}, {}, {"reward_mean": 0.0}, {"reward_mean": 0.0}, {"reward_mean": 0.5}]
    stream += [{"reward_mean": 0.0}] * 3
    assert fired(run(stream)) == [("reward_stuck", "stop", 7)]


def test_missing_metric_neither_counts_nor_resets_the_window() -> None:
    # checked steps with reward 0: 2, 3, 5 (step 4 has no reward_mean) -> fires at 5
    stream = [{}, {}, {"reward_mean": 0.0}, {"reward_mean": 0.0}, {"reward_mean": None}]
    stream += [{"reward_mean": 0.0}]
    assert fired(run(stream)) == [("reward_stuck", "stop", 5)]


def test_nothing_but_truncation_fires_during_warmup() -> None:
    # warm-up 10: steps 0..9 are ignored by every rule but truncation (set by the token limit,
    # not early noise); reward_stuck's window of 3 is steps 10, 11, 12.
    stream = [{"reward_mean": 0.0, "truncation_rate": 0.9}] * 12
    events = run(stream, warmup_steps=10)
    assert fired(events) == [("truncation", "warn", 0)]
    events = run(stream + [{"reward_mean": 0.0}], warmup_steps=10)
    assert fired(events) == [("truncation", "warn", 0), ("reward_stuck", "stop", 12)]


def test_truncation_speaks_at_the_first_step_with_the_default_warmup() -> None:
    """A 3-step run (shorter than health.warmup_steps=5) whose replies are cut hears it at step
    1, with the knob to raise."""
    gate = HealthGate()
    assert gate.cfg.warmup_steps == 5
    events = gate.check(1, {**HEALTHY, "truncation_rate": 0.94})
    assert fired(events) == [("truncation", "warn", 1)]
    assert "rollout.max_new_tokens" in events[0].advice


def test_has_boxed_below_floor_warns_at_once() -> None:
    events = run([{}, {}, {"has_boxed": 0.3}])
    assert fired(events) == [("has_boxed", "warn", 2)]
    assert events[0].values == {"has_boxed": 0.3, "min_value": 0.5}


def test_has_boxed_falling_fast_warns() -> None:
    # step 5: 0.6 is 0.95 - 0.6 = 0.35 below the best of the previous 3 checked steps (> 0.25)
    stream = [{}, {}] + [{"has_boxed": v} for v in (0.95, 0.95, 0.9, 0.6)]
    events = run(stream)
    assert fired(events) == [("has_boxed", "warn", 5)]
    assert events[0].values["recent_max"] == 0.95
    assert "fell" in events[0].advice


def test_has_boxed_small_or_slow_drops_are_tolerated() -> None:
    # One drop of 0.2 (0.95 -> 0.75, not more than 0.25), held for three steps, then a slow
    # slide of 0.05 per step: the best of the previous 3 checked values is then at most 0.15
    # above the current one (e.g. 0.6 vs max(0.75, 0.7, 0.65)), and no value is below 0.5.
    values = (0.95, 0.75, 0.75, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5)
    assert run([{}, {}] + [{"has_boxed": v} for v in values]) == []


def test_has_boxed_absent_never_fires() -> None:
    assert run([{"has_boxed": None}] * 10) == []


def test_a_rule_that_cannot_apply_is_never_checked() -> None:
    cfg = HealthConfig.model_validate(SHORT)
    gate = HealthGate(cfg, not_applicable=["has_boxed"])
    low = {**HEALTHY, "has_boxed": 0.0, "grad_norm": 1e9}
    assert [e.rule for e in gate.check(2, low)] == ["grad_norm_high"]  # the others still run
    with pytest.raises(ValueError, match=r"unknown health rules \['has_box'\]"):
        HealthGate(cfg, not_applicable=["has_box"])


@pytest.mark.parametrize(
    ("rows", "template", "system_prompt", "asks"),
    [
        ([{"prompt": "What is 3 + 4?"}], "none", None, False),  # the built-in arithmetic
        ([{"prompt": "What is 3 + 4?"}], "qwen_math", None, True),  # the template asks
        ([{"prompt": "What is 3 + 4?"}], "none", "Answer in \\boxed{}.", True),
        ([{"prompt": "x", "system_prompt": "put it in \\boxed{}"}], "none", None, True),
        ([{"prompt": "x"}, {"prompt": "Put the answer in \\boxed{}."}], "none", None, True),
        ([], "qwen_math", None, False),  # no rows: nothing is asked
    ],
)
def test_asks_for_boxed(rows, template, system_prompt, asks) -> None:
    from rlvr.data.templates import asks_for_boxed

    assert asks_for_boxed(rows, template, None, system_prompt) is asks


def test_grad_norm_zero_stops_after_window_but_skipped_steps_do_not_count() -> None:
    assert fired(run([{"grad_norm": 0.0}] * 5)) == [("grad_norm_zero", "stop", 4)]
    assert run([{}, {}, {"grad_norm": 0.0}, {"grad_norm": 0.0}, {}]) == []
    # steps 2..6 all report grad 0 but 3 and 4 were skipped updates (nonfinite rule's business)
    skipped = {"grad_norm": 0.0, "nonfinite_skipped": 1.0}
    stream = [{}, {}, {"grad_norm": 0.0}, skipped, skipped, {"grad_norm": 0.0}]
    assert run(stream) == []


def test_grad_norm_above_ceiling_warns() -> None:
    events = run([{}, {}, {"grad_norm": 100.0}, {"grad_norm": 150.0}])
    assert fired(events) == [("grad_norm_high", "warn", 3)]
    assert events[0].values == {"grad_norm": 150.0, "max_value": 100.0}


def test_adv_std_stuck_at_zero_warns() -> None:
    events = run([{"adv_std": 0.0}] * 5)
    assert fired(events) == [("adv_std_zero", "warn", 4)]
    assert events[0].values["reward_std"] == 0.3  # rewards vary: points at an advantage bug


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"truncation_rate": 0.5}, []),
        ({"truncation_rate": 0.6}, [("truncation", "warn", 2)]),
        # 0.25 + 0.2 = 0.45 > 0.4
        ({"clip_frac_low": 0.25, "clip_frac_high": 0.2}, [("clip_frac", "warn", 2)]),
        # 0.2 + 0.15 = 0.35 <= 0.4
        ({"clip_frac_low": 0.2, "clip_frac_high": 0.15}, []),
        # only one side logged: it alone counts
        ({"clip_frac_low": 0.5, "clip_frac_high": None}, [("clip_frac", "warn", 2)]),
        ({"logprob_diff_max": 9.0}, [("logprob_mismatch", "warn", 2)]),
        ({"logprob_diff_max": -9.0}, [("logprob_mismatch", "warn", 2)]),
        ({"logprob_k3": 0.5}, [("logprob_mismatch", "warn", 2)]),
        ({"logprob_diff_max": None, "logprob_k3": None}, []),
        # a batch sampled by older weights (rollout.max_staleness, sync_every, a partial push):
        # its gap is the policy's own change too, not the engine's mismatch
        ({"logprob_diff_max": 9.0, "logprob_k3": 0.5, "staleness_max": 1.0}, []),
        ({"logprob_diff_max": 9.0, "staleness_max": 0.0, "token_lag_max": 1.0}, []),
        ({"logprob_diff_max": 9.0, "staleness_max": 0.0}, [("logprob_mismatch", "warn", 2)]),
    ],
)
def test_instant_rules(overrides: dict, expected: list) -> None:
    assert fired(run([{}, {}, overrides])) == expected


def test_logprob_mismatch_names_what_was_exceeded() -> None:
    (event,) = run([{}, {}, {"logprob_diff_max": 9.0, "logprob_k3": 0.5}])
    assert "max |diff| 9 > 5" in event.advice and "k3 0.5 > 0.1" in event.advice
    assert event.values == {"logprob_diff_max": 9.0, "logprob_k3": 0.5}


def test_nonfinite_stops_after_more_than_n_in_a_row() -> None:
    skip = {"nonfinite_skipped": 1.0}
    # default max_consecutive = 2: the third skipped step in a row fires
    assert fired(run([{}, {}, skip, skip, skip])) == [("nonfinite", "stop", 4)]
    assert run([{}, {}, skip, skip, {}, skip, skip]) == []
    # a NaN loss counts even when the trainer did not flag the step
    nan_loss = {"policy_loss": math.nan, "nonfinite_skipped": None}
    assert fired(run([{}, {}, nan_loss, skip, {"grad_norm": math.inf}])) == [
        ("nonfinite", "stop", 4)
    ]


def test_rules_fire_once_per_episode() -> None:
    high, ok = {"truncation_rate": 0.9}, {"truncation_rate": 0.1}
    stream = [{}, {}, high, high, high, ok, high, high]
    assert fired(run(stream)) == [("truncation", "warn", 2), ("truncation", "warn", 6)]


def test_disabled_rule_and_changed_action() -> None:
    stream = [{}, {}, {"truncation_rate": 0.9}]
    assert run(stream, truncation={"enabled": False}) == []
    assert fired(run(stream, truncation={"action": "stop", "max_rate": 0.5})) == [
        ("truncation", "stop", 2)
    ]
    assert run(stream, truncation={"max_rate": 0.95}) == []


def test_every_configured_rule_has_a_check() -> None:
    assert set(RULE_NAMES) == set(HealthConfig.model_fields) - set(SHORT)


def test_default_actions_stop_only_the_fatal_rules() -> None:
    cfg = HealthConfig()
    actions = {
        name: getattr(cfg, name).action for name in type(cfg).model_fields if name not in SHORT
    }
    assert {name for name, action in actions.items() if action == "stop"} == {
        "reward_stuck",
        "grad_norm_zero",
        "nonfinite",
        "ratio_explosion",  # consecutive steps with ratios far from 1: the update is off-policy
        "grad_spikes",  # growing spikes: divergence
    }
    assert cfg.warmup_steps == 5 and cfg.window == 5


def _walk_fields(model: type[BaseModel], prefix: str = "") -> Iterable[tuple[str, object]]:
    for name, info in model.model_fields.items():
        yield prefix + name, info
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _walk_fields(annotation, prefix=f"{prefix}{name}.")


def test_every_config_field_is_documented() -> None:
    undocumented = [name for name, info in _walk_fields(HealthConfig) if not info.description]
    assert undocumented == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"windw": 3}, "windw"),
        ({"truncation": {"max_rate": 0.5, "maxrate": 0.1}}, "maxrate"),
        ({"clip_frac": {"action": "explode"}}, "explode"),
        ({"window": 0}, "window"),
        ({"reward_stuck": {"low": 1.0, "high": 0.0}}, "low"),
    ],
)
def test_config_rejects_bad_input(data: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        HealthConfig.model_validate(data)


def test_health_stop_carries_the_event() -> None:
    event = HealthEvent("nonfinite", "stop", 9, {"steps": 3}, "lower the LR")
    with pytest.raises(HealthStop, match="step 9.*'nonfinite'.*steps=3") as info:
        raise HealthStop(event)
    assert info.value.event is event
    assert first_stop([HealthEvent("a", "warn", 1), event]) is event
    assert first_stop([HealthEvent("a", "warn", 1)]) is None


def test_write_health_files(tmp_path: Path) -> None:
    warn = HealthEvent("truncation", "warn", 6, {"truncation_rate": 0.9}, "raise the limit")
    stop = HealthEvent("reward_stuck", "stop", 9, {"reward_mean": 0.0}, "check the reward")
    write_health(tmp_path, [warn])
    # The trainer may pass every event so far each time: nothing is appended twice.
    path = write_health(tmp_path, [warn, stop], stopped_by=stop)
    assert path == tmp_path / "health.json"
    summary = json.loads(path.read_text())
    assert summary["status"] == "stopped"
    assert summary["stopped_by"] == {
        "rule": "reward_stuck",
        "action": "stop",
        "step": 9,
        "values": {"reward_mean": 0.0},
        "advice": "check the reward",
    }
    assert [(e["rule"], e["step"]) for e in summary["events"]] == [
        ("truncation", 6),
        ("reward_stuck", 9),
    ]
    lines = (tmp_path / "health_events.jsonl").read_text().splitlines()
    assert [json.loads(line)["rule"] for line in lines] == ["truncation", "reward_stuck"]
    assert read_health(tmp_path) == summary


def test_write_health_status_without_stop_and_read_health_fallbacks(tmp_path: Path) -> None:
    assert read_health(tmp_path) is None
    write_health(tmp_path, [HealthEvent("clip_frac", "warn", 3, {"clip_frac": math.nan})])
    summary = read_health(tmp_path)
    assert summary["status"] == "warned" and summary["stopped_by"] is None
    assert math.isnan(summary["events"][0]["values"]["clip_frac"])
    (tmp_path / "health.json").unlink()
    # Only the event log left: read_health rebuilds a summary from it.
    assert [e["rule"] for e in read_health(tmp_path)["events"]] == ["clip_frac"]


def test_logprob_mismatch_judges_the_first_fresh_batch_during_warmup() -> None:
    """With rollout.max_staleness k >= 1 and an engine in the trainer's process, step 1's batch
    is the only one the current weights sampled (steps 2.. are 1 to k versions behind): inside
    the default warm-up (5 steps) it was skipped, so an engine that disagrees with the trainer
    (wrong weights, an off-by-one) was never reported at all. A gap above 5 nats is no early
    noise."""
    gate = HealthGate()
    assert gate.cfg.warmup_steps == 5
    events = []
    for step, lag in enumerate([0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], start=1):
        metrics = {**HEALTHY, "logprob_diff_max": 9.0, "staleness_max": lag}
        events += gate.check(step, metrics)
    assert fired(events) == [("logprob_mismatch", "warn", 1)]
