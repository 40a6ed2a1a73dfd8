"""Several seeds per side: the spreads by hand, the table, the plot file, and the whole runner
over two seeds on the tiny model (rlvr side only: no TRL venv needed)."""

from __future__ import annotations

import json

import pytest

from benchmarks.seeds import over_seeds, parse_seeds, plot_reward_vs_time, render_over_seeds


def test_parse_seeds():
    assert parse_seeds("0, 1,2") == [0, 1, 2]
    for bad, message in (("0,x", "'x' is not an integer"), ("1,1", "twice"), (",", "no seed")):
        with pytest.raises(ValueError, match=message):
            parse_seeds(bad)


def _run(step: int | None, seconds: float | None, median: float, rewards: list[float]) -> dict:
    summary = {
        "time_to_target_step": step,
        "time_to_target_s": seconds,
        "step_time_median_s": median,
    }
    return {"summary": summary, "steps": [{"wall_s": 2.0, "reward_mean": r} for r in rewards]}


def test_over_seeds_by_hand_and_the_table():
    per_seed = {
        "0": {"rlvr": _run(20, 300.0, 15.0, [0.1]), "trl": _run(26, 800.0, 30.0, [0.1])},
        "1": {"rlvr": _run(24, 360.0, 15.5, [0.2]), "trl": _run(None, None, 31.0, [0.2])},
        "2": {"rlvr": _run(22, 330.0, 14.0, [0.3]), "trl": _run(18, 540.0, 29.0, [0.3])},
    }
    over = over_seeds(per_seed)
    r, t = over["rlvr"], over["trl"]
    assert r["runs"] == t["runs"] == 3
    # rlvr steps 20, 24, 22: median 22, range 20-24; seconds 300, 360, 330: median 330
    assert (r["steps_to_target"]["median"], r["steps_to_target"]["min"]) == (22, 20)
    assert r["steps_to_target"]["max"] == 24 and r["seconds_to_target"]["median"] == 330
    # TRL seed 1 never reached the target: the spread is over the two runs that did
    assert t["steps_to_target"]["values"] == [26, None, 18]
    assert t["steps_to_target"]["missing"] == 1
    assert t["seconds_to_target"]["median"] == pytest.approx((800 + 540) / 2)
    lines = render_over_seeds(over, {"rlvr": "rlvr (transformers)", "trl": "TRL"})
    row = next(x for x in lines if x.startswith("| steps to target"))
    assert row == "| steps to target | 22 [20-24] | 22 [18-26], 1 not reached |"


def test_plot_is_a_real_png(tmp_path):
    per_seed = {
        "0": {"rlvr": _run(3, 6.0, 2.0, [0.1, 0.5, 0.9, 1.0])},
        "1": {"rlvr": _run(None, None, 2.0, [0.0, 0.1, 0.2, 0.2])},
    }
    path = plot_reward_vs_time(per_seed, tmp_path / "r.png", window=2, target=0.9)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_two_seeds_end_to_end(tmp_path, capsys):
    from benchmarks.step import main

    argv = ["--workload", "quick", "--steps", "2", "--warmup", "1", "--sides", "rlvr"]
    argv += ["--seeds", "0,1", "--threads", "1", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    (js,) = (tmp_path / "out").glob("*-quick.json")
    payload = json.loads(js.read_text())
    assert payload["seeds"] == [0, 1] and set(payload["per_seed"]) == {"0", "1"}
    for seed in ("0", "1"):
        assert len(payload["per_seed"][seed]["rlvr"]["steps"]) == 2  # raw per-step data kept
    assert payload["over_seeds"]["rlvr"]["runs"] == 2
    # the two seeds drew different prompts
    digests = [payload["per_seed"][s]["rlvr"]["steps"][0]["prompt_digest"] for s in ("0", "1")]
    assert digests[0] != digests[1]
    assert js.with_suffix(".png").stat().st_size > 0
    md = js.with_suffix(".md").read_text()
    assert "Over seeds (rlvr (transformers): 2 runs)" in md and js.with_suffix(".png").name in md


def test_a_run_cut_short_keeps_the_seeds_it_finished(tmp_path, monkeypatch):
    """Results are written after every seed: stopped during seed 1, the files hold seed 0."""
    import benchmarks.step as step

    real = step.run_seed
    calls = []

    def stop_on_second_seed(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(step, "run_seed", stop_on_second_seed)
    argv = ["--workload", "quick", "--steps", "2", "--warmup", "1", "--sides", "rlvr"]
    argv += ["--seeds", "0,1", "--threads", "1", "--out", str(tmp_path / "out")]
    with pytest.raises(KeyboardInterrupt):
        step.main(argv)
    (js,) = (tmp_path / "out").glob("*-quick.json")
    payload = json.loads(js.read_text())
    assert payload["seeds"] == [0, 1] and payload["seeds_done"] == [0]
    assert set(payload["per_seed"]) == {"0"}
    assert any(n.startswith("Partial: 1 of 2 seeds") for n in payload["notes"])


def test_the_target_workload_runs_five_seeds_unless_told_otherwise():
    from benchmarks.step import parse_args, pick_seeds
    from benchmarks.workloads import get_workload

    target = get_workload("target")
    assert pick_seeds(parse_args(["--workload", "target"]), target) == [0, 1, 2, 3, 4]
    assert pick_seeds(parse_args(["--seed", "7"]), target) == [7]
    assert pick_seeds(parse_args(["--seeds", "3,4"]), target) == [3, 4]
    assert pick_seeds(parse_args([]), get_workload("quick")) == [0]
