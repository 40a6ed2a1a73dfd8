from __future__ import annotations

import json
from pathlib import Path

from benchmarks.harness.report import render_markdown, results_paths, write_results


def _summary(step_s: float, rss: float, ttt: float | None = None) -> dict:
    return {
        "step_time_median_s": step_s,
        "step_time_iqr_s": 0.5,
        "phase_median_s": {"generate": step_s / 2, "update": step_s / 4, "other": 0.1},
        "completion_len_mean": 30.0,
        "gen_tokens_per_s": 100.0,
        "trained_tokens_per_s": 400.0,
        "e2e_tokens_per_s": 50.0,
        "train_flops_per_s": 2e11,
        "train_peak_fraction": 0.25,
        "peak_rss_mb": rss,
        "startup_s": 10.0,
        "reward_mean": 0.5,
        "time_to_target_s": ttt,
        "time_to_target_step": 3 if ttt else None,
    }


def _payload(name="default", target=None, trl=True, vllm=False):
    sides = {"rlvr": {"summary": _summary(2.0, 900.0, 60.0)}}
    if vllm:
        sides["rlvr-vllm"] = {
            "summary": _summary(1.0, 1500.0, 30.0),
            "ready": {"engine": "vllm", "versions": {"vllm": "0.32.0"}},
        }
    if trl:
        sides["trl"] = {"summary": _summary(4.0, 1200.0, None)}
    return {
        "date": "2030-01-02",
        "workload": {
            "name": name,
            "prompts_per_step": 2,
            "group_size": 8,
            "max_new_tokens": 64,
            "lr": 2e-5,
            "micro_batch": 8,
            "target_reward": target,
            "target_window": 3,
        },
        "model": "SmolLM2-135M-Instruct",
        "machine": {"cpu": "Test CPU", "cores": 2, "ram_gib": 24.0},
        "load_average_start": [0.1, 0.2, 0.3],
        "load_average_end": [1.0, 0.5, 0.4],
        "matmul_peak_gflops": {"bfloat16": 640.0, "float32": 160.0},
        "threads": 2,
        "seed": 0,
        "steps": 10,
        "warmup": 2,
        "block": 2,
        "prompts_match": True,
        "command": "python -m benchmarks.step --workload default",
        "sides": sides,
        "notes": ["a note"],
    }


def _cells(md: str, figure: str) -> list[str]:
    row = next(line for line in md.splitlines() if line.startswith(f"| {figure} |"))
    return [c.strip() for c in row.strip("|").split("|")]


def _header(md: str) -> str:
    return next(line for line in md.splitlines() if line.startswith("| figure |"))


def test_table_has_both_sides_and_ratios():
    md = render_markdown(_payload())
    assert _header(md) == "| figure | rlvr (transformers) | TRL | rlvr/TRL |"
    # step time 2.0 vs 4.0 -> 0.50; peak RSS 900 vs 1200 -> 0.75; generation 1.0 vs 2.0 -> 0.50
    assert _cells(md, "step time, median (s)") == ["step time, median (s)", "2.00", "4.00", "0.50"]
    assert _cells(md, "peak RSS, children included (MB)")[1:] == ["900", "1200", "0.75"]
    assert _cells(md, "- generation (s, median)")[1:] == ["1.00", "2.00", "0.50"]
    assert _cells(md, "training, % of matmul peak")[1:] == ["25.0", "25.0", "1.00"]
    assert "load average (1/5/15 min) at start 0.10/0.20/0.30" in md
    assert "- a note" in md
    assert "Steps per side: 10 (first 2 left out as warm-up)" in md
    assert "time to" not in md  # not a target workload


def test_target_rows_and_missing_values():
    md = render_markdown(_payload("target", target=0.9))
    assert _cells(md, "time to 3-step mean reward 0.9 (s)")[1:] == ["60", "n/a", "n/a"]
    # a target run that stopped at step 2 keeps only 1 warm-up step on that side
    payload = _payload("target", target=0.9)
    payload["sides"]["rlvr"]["summary"]["warmup_used"] = 1
    assert "warm-up steps left out: rlvr (transformers) 1, TRL 2" in render_markdown(payload)
    # without TRL: one column per side present and no ratio column
    md = render_markdown(_payload(trl=False))
    assert _header(md) == "| figure | rlvr (transformers) |"
    assert _cells(md, "step time, median (s)")[1:] == ["2.00"]
    md = render_markdown(_payload(trl=False, vllm=True))
    assert _header(md) == "| figure | rlvr (transformers) | rlvr (vLLM) |"
    assert _cells(md, "peak RSS, children included (MB)")[1:] == ["900", "1500"]


def test_three_sides_one_ratio_column_per_rlvr_side():
    payload = _payload(vllm=True)
    # the order of turns does not move the columns
    payload["sides"] = {s: payload["sides"][s] for s in ("trl", "rlvr-vllm", "rlvr")}
    md = render_markdown(payload)
    assert md.startswith(
        "# Benchmark `default`: rlvr (transformers) vs rlvr (vLLM) vs TRL GRPOTrainer"
    )
    assert _header(md) == (
        "| figure | rlvr (transformers) | rlvr (vLLM) | TRL | rlvr/TRL | rlvr+vLLM/TRL |"
    )
    assert "|---|---|---|---|---|---|" in md
    # step time: rlvr 2.0 / TRL 4.0 = 0.50, vLLM 1.0 / 4.0 = 0.25
    assert _cells(md, "step time, median (s)")[1:] == ["2.00", "1.00", "4.00", "0.50", "0.25"]
    # peak RSS: 900 / 1200 = 0.75, 1500 / 1200 = 1.25
    assert _cells(md, "peak RSS, children included (MB)")[1:] == [
        "900",
        "1500",
        "1200",
        "0.75",
        "1.25",
    ]
    # rows without a ratio leave both ratio cells empty
    assert _cells(md, "step time, IQR (s)")[1:] == ["0.50", "0.50", "0.50", "", ""]
    assert "- Rollout engines: rlvr (vLLM) `rollout.engine=vllm` (vllm 0.32.0)" in md
    # a target run: TRL never got there, so both ratios are n/a
    payload = _payload("target", target=0.9, vllm=True)
    md = render_markdown(payload)
    assert _cells(md, "time to 3-step mean reward 0.9 (s)")[1:] == ["60", "30", "n/a", "n/a", "n/a"]


def test_header_names_the_precision_and_its_peak():
    md = render_markdown(
        {**_payload(), "precision": "float32", "precision_reason": "auto: no bf16 fast path"}
    )
    assert "- Precision: float32 (auto: no bf16 fast path); matmul peak" in md
    assert "bf16 640 GFLOP/s, float32 160 GFLOP/s; the update is set against the float32 peak" in md
    assert "threads: 2, float32" in md
    assert "instruction set capped" not in md
    capped = _payload()
    capped["machine"] = {**capped["machine"], "isa_limits": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}
    assert "GiB (instruction set capped: ONEDNN_MAX_CPU_ISA=AVX2); load" in render_markdown(capped)
    # a file from before --precision was a bf16 run
    assert "the update is set against the bf16 peak" in render_markdown(_payload())


def test_header_names_the_malloc_each_side_ran_with():
    payload = _payload()
    payload["sides"]["rlvr"]["ready"] = {"allocator": "tcmalloc (/usr/lib/libtcmalloc.so.4)"}
    payload["sides"]["trl"]["ready"] = {"allocator": "system malloc"}
    md = render_markdown(payload)
    assert (
        "- malloc: rlvr (transformers) tcmalloc (/usr/lib/libtcmalloc.so.4), TRL system malloc"
        in md
    )
    assert "- malloc:" not in render_markdown(_payload())  # files from before recorded none


def test_old_results_file_still_renders():
    """Results written before the vLLM side (two sides, a flat "ratios" dict) render as before."""
    js = Path(__file__).resolve().parent.parent / "results" / "2026-11-22-default.json"
    payload = json.loads(js.read_text())
    md = render_markdown(payload)
    assert _header(md) == "| figure | rlvr (transformers) | TRL | rlvr/TRL |"
    assert _cells(md, "step time, median (s)")[1:] == ["13.27", "20.83", "0.64"]
    assert "Rollout engines" not in md


def test_results_files_never_overwrite(tmp_path):
    js, md = write_results(tmp_path, _payload())
    assert (js.name, md.name) == ("2030-01-02-default.json", "2030-01-02-default.md")
    assert json.loads(js.read_text())["sides"]["rlvr"]["summary"]["peak_rss_mb"] == 900.0
    assert md.read_text() == render_markdown(_payload())
    js2, _ = results_paths(tmp_path, "2030-01-02", "default")
    assert js2.name == "2030-01-02-default-2.json"
