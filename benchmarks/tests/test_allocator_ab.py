"""The malloc A/B's figures, worked by hand."""

from __future__ import annotations

import pytest

from benchmarks.studies.allocator_ab import main, render, same_rewards, summarize


def _step(step_s, gen, upd, reward, rss):
    return {
        "step_s": step_s,
        "generate_s": gen,
        "update_s": upd,
        "reward_mean": reward,
        "maxrss_mb": rss,
    }


def test_medians_leave_out_the_warmup_of_each_run_and_peak_is_the_largest():
    a = {
        "steps": [_step(99, 9, 90, 0.1, 100), _step(10, 4, 6, 0.2, 300), _step(12, 5, 7, 0.3, 310)]
    }
    b = {
        "steps": [_step(50, 9, 41, 0.1, 120), _step(14, 6, 8, 0.2, 290), _step(16, 7, 9, 0.3, 400)]
    }
    s = summarize([a, b], warmup=1)
    # after warm-up: step times 10, 12, 14, 16 -> median 13; generation 4, 5, 6, 7 -> 5.5
    assert s == {"step_s": 13.0, "generate_s": 5.5, "update_s": 7.5, "peak_rss_mb": 400}


def test_same_rewards_compares_every_run_of_every_allocator():
    run = {"steps": [_step(1, 1, 1, 0.25, 1), _step(1, 1, 1, 0.5, 1)]}
    other = {"steps": [_step(1, 1, 1, 0.25, 1), _step(1, 1, 1, 0.375, 1)]}
    assert same_rewards({"system": [run], "tcmalloc": [run, run]})
    assert not same_rewards({"system": [run], "tcmalloc": [other]})


def test_table_sets_each_allocator_against_the_system_one():
    summary = {
        "system": {"step_s": 20.0, "generate_s": 8.0, "update_s": 12.0, "peak_rss_mb": 5000.0},
        "tcmalloc": {"step_s": 15.0, "generate_s": 6.0, "update_s": 9.0, "peak_rss_mb": 4500.0},
    }
    payload = {
        "workload": "target",
        "date": "2030-01-01",
        "machine": {"cpu": "Test CPU", "cores": 2},
        "precision": "bf16",
        "threads": 2,
        "seed": 0,
        "steps": 10,
        "warmup": 2,
        "rounds": 1,
        "allocators": ["system", "tcmalloc"],
        "mapped": {"system": ["system malloc"], "tcmalloc": ["tcmalloc (/l/t.so)"]},
        "same_rewards": True,
        "command": "python -m benchmarks.studies.allocator_ab",
        "summary": summary,
    }
    md = render(payload)
    assert "| figure | system | tcmalloc | tcmalloc/system |" in md
    assert "| step time, median (s) | 20.00 | 15.00 | 0.75 |" in md
    assert "| peak RSS (MB) | 5000 | 4500 | 0.90 |" in md
    assert "Same per-step rewards in every run: yes" in md


def test_bad_allocator_names_are_refused_before_any_run(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--allocators", "system,mimalloc"])
    assert exc.value.code == 2
    assert "--allocators: ['mimalloc']" in capsys.readouterr().err
