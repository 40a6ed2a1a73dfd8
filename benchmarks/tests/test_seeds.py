"""Several seeds per side: the spreads by hand, the table, the plot file, and the whole runner
over two seeds on the tiny model (rlvr side only: no TRL venv needed)."""

from __future__ import annotations

import json

import pytest

from benchmarks.harness.seeds import (
    over_seeds,
    parse_seeds,
    plot_reward_vs_time,
    render_over_seeds,
    sign_test,
)


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
        "peak_rss_mb": 100.0 * median,
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
    # paired with TRL's run of the same seed: 300/800, (TRL missed seed 1), 330/540
    vs = r["vs_peer"]
    assert vs["seconds_to_target"]["values"] == pytest.approx([0.375, None, 330 / 540])
    assert vs["seconds_to_target"]["median"] == pytest.approx((0.375 + 330 / 540) / 2)
    assert vs["steps_to_target"]["missing"] == 1
    # step times 15/30, 15.5/31, 14/29: median 0.5
    assert vs["step_time_median_s"]["median"] == pytest.approx(0.5)
    assert "vs_peer" not in t
    # peak RSS 1500, 1550, 1400 against TRL's 3000, 3100, 2900 (TRL missing the target does not
    # drop a seed from a figure that has nothing to do with the target)
    assert vs["peak_rss_mb"]["median"] == pytest.approx(0.5) and vs["peak_rss_mb"]["missing"] == 0
    assert r["peak_rss_mb"]["median"] == 1500
    # every run made one step: reward over the common step is the step's own, per seed
    assert r["common_steps"] == 1
    assert r["reward_first_steps"]["values"] == pytest.approx([0.1, 0.2, 0.3])
    assert r["completion_len_first_steps"]["values"] == [None, None, None]  # not recorded
    lines = render_over_seeds(over, {"rlvr": "rlvr (transformers)", "trl": "TRL"})
    row = next(x for x in lines if x.startswith("| seconds to target, ratio"))
    assert (
        row
        == "| seconds to target, ratio to TRL's same-seed run | 0.49 [0.38-0.61], 1 not reached |  |"
    )
    # steps 20 < 26, 24 < never, 22 > 18: fewer in 2, more in 1; p = 2 x (1 + 3) / 2^3, capped at 1
    assert r["steps_sign_test"] == {"fewer": 2, "equal": 0, "more": 1, "p": 1.0}
    assert "steps_sign_test" not in t
    assert lines[-1] == (
        "- Steps to target, rlvr (transformers) against TRL's same-seed run: fewer in 2 seed(s), "
        "as many in 0, more in 1 (a seed that missed the target counts as more; two-sided sign "
        "test over the seeds that differ: p = 1.00)."
    )


def test_sign_test_by_hand():
    # 9 of 10 seeds fewer: p = 2 x (C(10,0) + C(10,1)) / 2^10 = 22 / 1024
    assert sign_test([1] * 9 + [5], [2] * 10) == {
        "fewer": 9,
        "equal": 0,
        "more": 1,
        "p": pytest.approx(22 / 1024),
    }
    # ties drop out: 6 fewer, 1 more, 2 equal -> n = 7, p = 2 x (1 + 7) / 2^7 = 0.125
    ours = [1, 1, 1, 1, 1, 1, 3, 2, 2]
    peer = [2, 2, 2, 2, 2, 2, 2, 2, 2]
    assert sign_test(ours, peer) == {"fewer": 6, "equal": 2, "more": 1, "p": pytest.approx(0.125)}
    # a missed target (None) is more than any number; two misses tie; no differing seed: p = 1
    assert sign_test([None, None, 4], [30, None, 4]) == {
        "fewer": 0,
        "equal": 2,
        "more": 1,
        "p": 1.0,
    }
    assert sign_test([], []) == {"fewer": 0, "equal": 0, "more": 0, "p": 1.0}
    # all 8 seeds the other way: p = 2 / 2^8, the same as all 8 fewer
    assert sign_test([3] * 8, [2] * 8)["p"] == pytest.approx(2 / 256)
    with pytest.raises(ValueError):
        sign_test([1, 2], [1])


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
    # the .md and plot are rebuilt from the .json alone (the raw per-step data it keeps)
    from benchmarks.harness.report import main as report_main

    js.with_suffix(".md").unlink()
    js.with_suffix(".png").unlink()
    assert report_main([str(js)]) == 0
    assert js.with_suffix(".md").read_text() == md
    assert js.with_suffix(".png").stat().st_size > 0


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
    from benchmarks.harness.workloads import get_workload
    from benchmarks.step import parse_args, pick_seeds

    target = get_workload("target")
    assert pick_seeds(parse_args(["--workload", "target"]), target) == [0, 1, 2, 3, 4]
    assert pick_seeds(parse_args(["--seed", "7"]), target) == [7]
    assert pick_seeds(parse_args(["--seeds", "3,4"]), target) == [3, 4]
    assert pick_seeds(parse_args([]), get_workload("quick")) == [0]


def test_learning_is_compared_over_the_steps_every_run_made():
    def run(rewards, tokens=None):
        steps = [{"wall_s": 1.0, "reward_mean": r, "sequences": 4} for r in rewards]
        for rec, n in zip(steps, tokens or [], strict=False):
            rec["completion_tokens"] = n
        return {"summary": {"step_time_median_s": 1.0}, "steps": steps}

    per_seed = {
        "0": {"rlvr": run([0.2, 0.4, 0.9], [40, 20, 10]), "trl": run([0.0, 0.2], [80, 40])},
        "1": {"rlvr": run([0.5, 0.5], [8, 8]), "trl": run([0.1, 0.3, 0.5], [16, 16, 16])},
    }
    over = over_seeds(per_seed)
    assert over["rlvr"]["common_steps"] == over["trl"]["common_steps"] == 2
    # seed 0 rlvr: (0.2 + 0.4) / 2, its third step left out; seed 1: 0.5
    assert over["rlvr"]["reward_first_steps"]["values"] == pytest.approx([0.3, 0.5])
    assert over["trl"]["reward_first_steps"]["values"] == pytest.approx([0.1, 0.2])
    # (40 + 20) tokens over 8 completions; (16 + 16) over 8
    assert over["rlvr"]["completion_len_first_steps"]["values"] == pytest.approx([7.5, 2.0])
    assert over["trl"]["completion_len_first_steps"]["values"] == pytest.approx([15.0, 4.0])
    lines = render_over_seeds(over, {"rlvr": "rlvr", "trl": "TRL"})
    assert (
        "| training reward, mean of steps 1-2 | 0.400 [0.300-0.500] | 0.150 [0.100-0.200] |"
        in lines
    )
