"""The split-core asynchrony study's figures, worked by hand."""

from __future__ import annotations

import json

import pytest

from benchmarks.studies.async_split import (
    SHAPES,
    lora_params,
    main,
    run_summary,
    summarize,
    sync_bytes_table,
    total_params,
)


def _records(rewards, wall=2.0, lag=0.5):
    return [
        {"step": i + 1, "reward_mean": r, "reply_len": 10.0, "wall_s": wall + i,
         "time_rollout": 1.0, "time_generate": 3.0, "time_logprobs": 0.5, "time_update": 1.5,
         "time_sync": 0.25, "time_wait_ahead": 0.0, "token_lag_mean": lag * i,
         "token_lag_max": float(i > 0)}
        for i, r in enumerate(rewards)
    ]  # fmt: skip


def test_total_params_are_the_published_counts():
    # SmolLM2-135M, Qwen2.5-7B and gpt-oss-20b as their model cards count them
    assert total_params(SHAPES["SmolLM2-135M"]) == 134_515_008
    assert total_params(SHAPES["Qwen2.5-7B"]) == 7_615_616_512
    assert total_params(SHAPES["gpt-oss-20b"]) == 20_914_757_184


def test_lora_params_by_hand():
    # 135M, rank 16, every linear: per block q 16*(576+576), k and v 16*(576+192), o like q,
    # gate and up 16*(576+1536), down 16*(1536+576): 162,816; 30 blocks
    every = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert lora_params(SHAPES["SmolLM2-135M"], 16, every) == 30 * 162_816
    # Qwen2.5-7B q/k/v/o: 16*(2*(3584+3584) + 2*(3584+512)) = 360,448 per block, 28 blocks
    assert lora_params(SHAPES["Qwen2.5-7B"], 16, every[:4]) == 28 * 360_448
    # gpt-oss-20b experts: 32 x 16 x ((2880 + 5760) + (2880 + 2880)) per block
    gpt = SHAPES["gpt-oss-20b"]
    experts = lora_params(gpt, 16, ("gate_up_proj", "down_proj"))
    assert experts == 24 * 32 * 16 * (8640 + 5760)


def test_the_adapter_moves_under_five_percent_of_the_135m_sync():
    rows = {r["model"]: r for r in sync_bytes_table()}
    small = rows["SmolLM2-135M"]
    assert small["full_bytes"] == 2 * 134_515_008
    assert small["adapter_all_linear_bytes"] == 2 * 30 * 162_816  # 9.77 MB
    assert small["all_linear_share"] == pytest.approx(0.03631, abs=1e-5)  # < 5%
    assert rows["Qwen2.5-7B"]["adapter_attention_bytes"] == 2 * 28 * 360_448


def test_run_summary_reads_target_phases_tokens_and_lag():
    recs = _records([0.5, 0.9, 0.9, 0.9, 1.0, 0.8, 0.7])
    s = run_summary(recs, target=0.9, window=3, sequences=32)
    assert s["steps_to_target"] == 4 and s["seconds_to_target"] == pytest.approx(2 + 3 + 4 + 5)
    assert s["final_reward"] == pytest.approx(0.86)
    assert s["step_time_median_s"] == pytest.approx(5.5)  # steps 2-7: 3..8 s
    # 7 steps x 10 tokens x 32 replies over 2+3+...+8 = 35 s
    assert s["tokens_per_s"] == pytest.approx(7 * 320 / 35)
    assert s["token_lag_mean"] == pytest.approx(0.5 * 3)  # 0, 0.5, ..., 3.0
    assert s["token_lag_max"] == 1.0
    assert s["phases_s"] == {"wait_rollout": 1.0, "generate": 3.0, "logprobs_update": 2.0,
                             "sync": 0.25, "wait_push": 0.0}  # fmt: skip


def test_an_on_policy_run_counts_its_wait_as_generation():
    recs = _records([0.5, 0.5])
    for r in recs:
        del r["time_generate"]  # k0 has no batch generated ahead
    assert run_summary(recs, 0.9, 3, 32)["phases_s"]["generate"] == 1.0  # its time_rollout


def test_summarize_compares_each_arm_with_k0_seed_by_seed():
    runs = {
        "k0": {"0": _records([0, 0, 1, 1, 1], wall=4.0), "1": _records([1, 1, 1], wall=4.0)},
        "k1": {"0": _records([0, 0, 1, 1, 1], wall=2.0), "1": _records([0, 0, 0], wall=2.0)},
    }
    s = summarize(runs, 0.9, 3, 32)
    assert s["seeds"] == [0, 1]
    # k0: seed 0 reaches at step 5 (4+5+6+7+8 = 30 s), seed 1 at step 3 (15 s);
    # k1: seed 0 at step 5 (2+3+4+5+6 = 20 s), seed 1 never
    assert [r["seconds_to_target"] for r in s["runs"]["k0"]] == [30.0, 15.0]
    assert s["vs_k0"]["k1"]["time_ratio_median"] == pytest.approx(20 / 30)
    assert s["vs_k0"]["k1"]["sign"] == {"fewer": 1, "equal": 0, "more": 1, "p": 1.0}
    assert s["median"]["k1"]["missed"] == 1
    assert s["vs_k0"]["k1"]["final_reward_diff_median"] == pytest.approx((0.0 - 1.0) / 2)
    assert "k0" not in s["vs_k0"]


def test_bad_arguments_are_refused_by_name(capsys):
    for argv, msg in ((["--arms", "k0,k3"], "unknown k3"), (["--cores", "1,1"], "--cores=1,1")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        assert msg in capsys.readouterr().err


def _study(path, **over):
    """A study file as an earlier sitting wrote it: this machine, 30 steps, cores 0 and 1, the
    arms' overrides of today, one k0 run of seed 0."""
    from benchmarks.harness.machine import machine_info
    from benchmarks.studies.async_split import ARMS

    study = {
        "machine": machine_info(), "cores": [0, 1], "steps": 30,
        "arms": {a: list(o) for a, o in ARMS.items()}, "runs": {"k0": {"0": _records([0.5])}},
    } | over  # fmt: skip
    path.write_text(json.dumps(study))
    return path


def test_a_study_goes_on_from_an_earlier_days_file_only_with_runs_that_pool(tmp_path):
    """Five seeds of four arms to the target take longer than a sitting, and the file is named
    for the day it was started: ``--study`` takes it back. A call whose runs would not be
    comparable stops before any work, naming each setting (steps, cores, an arm's overrides)."""
    argv = ["--seeds", "0", "--arms", "k1"]
    for over, msg in (
        ({"steps": 4}, "steps 4 there, 30 here"),
        ({"cores": [1, 0]}, "cores [1, 0] there, [0, 1] here"),
        ({"arms": {"k0": ["rollout.max_staleness=0", "rollout.partial=true"]}}, "arm k0"),
    ):
        path = _study(tmp_path / "earlier-async-split.json", **over)
        with pytest.raises(SystemExit) as e:
            main([*argv, "--study", str(path), "--steps", "30"])
        assert msg in str(e.value), e.value
        assert str(path) in str(e.value)


def test_runs_of_other_code_pool_only_with_any_code(tmp_path):
    """The study's code is rlvr, the harness, the worker and this study (its pinning): a run
    made with other code is refused unless --any-code, and each run's state is then recorded."""
    from benchmarks.harness.study_file import code_line
    from benchmarks.studies.async_split import CODE, REPO, check_compatible, src_state

    assert "benchmarks/studies/async_split.py" in CODE and "src" in CODE
    here = json.loads(_study(tmp_path / "here.json").read_text()) | {"src": src_state(REPO)}
    old = here | {"src": "0123456789abcdef"}
    path = tmp_path / "earlier.json"
    with pytest.raises(SystemExit, match="src '0123456789abcdef' there"):
        check_compatible(old, here, path)
    check_compatible(old, here, path, any_code=True)  # pools
    two = here | {"runs": {"k0": {"0": []}, "k1": {"0": []}},
                  "run_src": {"k0": {"0": "0123456789abcdef"}, "k1": {"0": here["src"]}}}  # fmt: skip
    assert code_line(two) == ["Code: runs from 2 recorded code state(s) (`run_src` in the JSON)."]
