"""The rollout-correction study's figures, worked by hand."""

from __future__ import annotations

import pytest

from benchmarks.studies.correction_ab import main, run_summary, summarize


def _records(rewards, gap=0.01, masked=None):
    out = []
    for i, r in enumerate(rewards):
        rec = {"step": i + 1, "reward_mean": r, "reply_len": 10.0, "wall_s": 2.0 + i,
               "logprob_diff_mean": gap * (i + 1), "logprob_diff_max": 0.1 * (i + 1)}  # fmt: skip
        if masked is not None:
            rec["tis_masked_frac"] = masked[i]
        out.append(rec)
    return out


def test_run_summary_reads_target_final_reward_and_gap():
    recs = _records([0.5, 0.9, 0.9, 0.9, 1.0, 0.8, 0.7], masked=[0, 0, 0.5, 0, 0, 0, 0.25])
    s = run_summary(recs, target=0.9, window=3)
    # trailing 3-step means: -, -, 0.767, 0.9 -> step 4; seconds 2 + 3 + 4 + 5
    assert s["steps_to_target"] == 4
    assert s["seconds_to_target"] == pytest.approx(14.0)
    # the last 5 steps: 0.9, 0.9, 1.0, 0.8, 0.7
    assert s["final_reward"] == pytest.approx(0.86)
    # gap per step 0.01 .. 0.07: mean 0.04; largest max 0.7
    assert s["logprob_diff_mean"] == pytest.approx(0.04)
    assert s["logprob_diff_max"] == pytest.approx(0.7)
    assert s["tis_masked_frac"] == pytest.approx(0.75 / 7)
    assert s["tis_truncated_frac"] is None  # an arm without the statistic says so
    assert s["step_time_median_s"] == pytest.approx(5.0)


def test_summarize_pairs_arms_by_seed_and_counts_misses_as_more():
    runs = {
        "off": {"0": _records([1, 1, 1]), "1": _records([0, 1, 1, 1]), "2": _records([0, 0, 0])},
        "token-truncate": {
            "0": _records([0, 1, 1, 1]),
            "1": _records([1, 1, 1]),
            "2": _records([0, 1, 1, 1]),
        },  # fmt: skip
        "sequence-mask": {"0": _records([1, 1, 1]), "1": _records([0, 1, 1, 1])},
    }
    s = summarize(runs, 0.9, 3)
    assert s["seeds"] == [0, 1]  # seed 2 lacks sequence-mask
    assert [r["steps_to_target"] for r in s["runs"]["off"]] == [3, 4]
    assert [r["steps_to_target"] for r in s["runs"]["token-truncate"]] == [4, 3]
    assert s["vs_off"]["token-truncate"] == {"fewer": 1, "equal": 0, "more": 1, "p": 1.0}
    assert s["vs_off"]["sequence-mask"]["equal"] == 2
    assert s["median"]["off"]["steps_to_target"] == 3.5
    assert "off" not in s["vs_off"]

    # with seed 2 for every arm, off's miss counts as more steps than token-truncate's 4
    runs["sequence-mask"]["2"] = _records([0, 0, 0])
    s = summarize(runs, 0.9, 3)
    assert s["seeds"] == [0, 1, 2]
    assert s["median"]["off"]["missed"] == 1
    assert s["median"]["off"]["steps_to_target"] == 3.5  # over the runs that got there
    assert s["vs_off"]["token-truncate"]["fewer"] == 2
    assert s["vs_off"]["sequence-mask"]["equal"] == 3  # two misses are a tie


def test_unknown_arm_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--arms", "off,token-mask"])
    assert e.value.code == 2
    assert "unknown token-mask" in capsys.readouterr().err


def test_a_study_goes_on_only_with_runs_that_pool(tmp_path):
    from benchmarks.studies.correction_ab import check_compatible

    machine = {"cpu": "Xeon A", "cores": 2, "ram_gib": 23.5}
    here = {"steps": 30, "threads": 2, "cap": 2.0, "machine": machine, "runs": {}}
    path = tmp_path / "2026-11-28-correction-ab.json"
    check_compatible({}, here, path)  # a new study
    check_compatible({**here, "runs": {"off": {"0": []}}}, here, path)  # the same settings
    # eight-step runs do not pool with thirty-step ones; nor runs from another CPU
    old = {**here, "steps": 8, "machine": {**machine, "cpu": "Xeon B"}, "runs": {"off": {"0": []}}}
    with pytest.raises(SystemExit) as e:
        check_compatible(old, here, path)
    msg = str(e.value)
    assert "steps 8 there, 30 here" in msg
    assert "machine cpu 'Xeon B' there, 'Xeon A' here" in msg
    assert str(path) in msg and "threads" not in msg


def test_a_study_refuses_runs_of_an_isa_limited_machine_or_of_other_arm_overrides(tmp_path):
    """The same CPU under ONEDNN_MAX_CPU_ISA (an AVX2-only run) computes with other kernels: the
    log-prob gap the study measures is not the same quantity; nor does an arm whose overrides
    changed since the file's runs pool with its earlier runs under the same name."""
    from benchmarks.studies.correction_ab import ARMS, check_compatible

    machine = {"cpu": "Xeon A", "cores": 2, "isa_limits": {}}
    here = {
        "steps": 30, "threads": 2, "cap": 2.0, "machine": machine, "runs": {},
        "arms": {a: list(o) for a, o in ARMS.items()},
    }  # fmt: skip
    path = tmp_path / "study.json"
    limited = {**machine, "isa_limits": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}
    with pytest.raises(SystemExit) as e:
        check_compatible({**here, "machine": limited, "runs": {"off": {"0": []}}}, here, path)
    assert "machine isa_limits {'ONEDNN_MAX_CPU_ISA': 'AVX2'} there, {} here" in str(e.value)
    arms = {**here["arms"], "sequence-mask": ["algo.rollout_correction.level=token"]}
    runs = {"sequence-mask": {"0": []}, "off": {"0": []}}
    with pytest.raises(SystemExit) as e:
        check_compatible({**here, "arms": arms, "runs": runs}, here, path)
    msg = str(e.value)
    assert "arm sequence-mask ['algo.rollout_correction.level=token'] there" in msg
    assert "arm off" not in msg
    # an arm the file has no runs of may have changed: nothing of it pools
    check_compatible({**here, "arms": arms, "runs": {"off": {"0": []}}}, here, path)
    # nor does an arm no longer defined here: no run of it is added
    retired = {**here["arms"], "retired": ["algo.tis_cap=2"]}
    check_compatible({**here, "arms": retired, "runs": {"retired": {"0": []}}}, here, path)


def test_a_study_refuses_runs_of_other_training_code(tmp_path):
    """rlvr's own code (or the workload's) changes between sittings (the 2026-11-26 study's sequence-mask runs
    predate level=sequence becoming the product of the token ratios): the same arm name, steps
    and machine then train something else. The study records a hash of the code's trees (and
    of uncommitted edits) and refuses to pool across a change."""
    import subprocess

    from benchmarks.studies.correction_ab import check_compatible, src_state

    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "a.py").write_text("x = 1\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    first = src_state(repo)
    (repo / "README").write_text("docs only\n")  # outside src/: the same code
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "docs"], check=True)
    assert src_state(repo) == first
    (repo / "src" / "a.py").write_text("x = 2\n")
    edited = src_state(repo)
    assert edited != first
    subprocess.run([*git, "commit", "-qam", "two"], check=True)
    second = src_state(repo)
    assert second not in (first, edited)
    (repo / "benchmarks" / "harness").mkdir(parents=True)  # the workload's definition
    (repo / "benchmarks" / "harness" / "workloads.py").write_text("LR = 1e-5\n")
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "workload"], check=True)
    assert src_state(repo) != second
    here = {"steps": 30, "threads": 2, "cap": 2.0, "machine": {}, "src": first, "runs": {}}
    path = tmp_path / "study.json"
    check_compatible({**here, "runs": {"off": {"0": []}}}, here, path)
    with pytest.raises(SystemExit) as e:
        check_compatible({**here, "src": edited, "runs": {"off": {"0": []}}}, here, path)
    assert f"src {edited!r} there, {first!r} here" in str(e.value)


def test_any_code_pools_runs_of_other_code_and_the_report_counts_the_states(tmp_path):
    """A five-seed study outlives a session; --any-code pools runs of another code state
    anyway, and the report says from how many states (and whether some were not recorded)."""
    from benchmarks.studies.correction_ab import check_compatible, code_line

    here = {"steps": 30, "threads": 2, "cap": 2.0, "machine": {}, "src": "b" * 16, "runs": {}}
    old = {**here, "src": "a" * 16, "runs": {"off": {"0": []}}}
    path = tmp_path / "study.json"
    with pytest.raises(SystemExit, match="--any-code pools runs of other code"):
        check_compatible(old, here, path)
    check_compatible(old, here, path, any_code=True)
    # every other difference still refuses
    with pytest.raises(SystemExit, match="steps 8 there, 30 here"):
        check_compatible({**old, "steps": 8}, here, path, any_code=True)

    one = {"runs": {"off": {"0": [], "1": []}}, "run_src": {"off": {"0": "a", "1": "a"}}}
    assert code_line(one) == []  # one recorded state: nothing to say
    two = {**one, "run_src": {"off": {"0": "a", "1": "b"}}}
    assert code_line(two) == ["Code: runs from 2 recorded code state(s) (`run_src` in the JSON)."]
    unrecorded = {**one, "run_src": {"off": {"1": "b"}}}  # seed 0 from a file before run_src
    assert code_line(unrecorded) == [
        "Code: runs from 1 recorded code state(s) and runs whose code was not recorded "
        "(`run_src` in the JSON)."
    ]
