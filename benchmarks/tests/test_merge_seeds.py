"""Pooling the seeds of several results files: the spreads by hand, the refusals, real files."""

from __future__ import annotations

import copy
import json

import pytest

from benchmarks import merge_seeds


def _run(step: int, seconds: float, median: float) -> dict:
    summary = {
        "time_to_target_step": step,
        "time_to_target_s": seconds,
        "step_time_median_s": median,
        "peak_rss_mb": 1000.0,
    }
    return {"summary": summary, "steps": [{"wall_s": median, "reward_mean": 0.5}] * 2}


def _payload(per_seed: dict, *, seeds_default=(0, 1, 2, 3, 4), time="07:00:00") -> dict:
    return {
        "date": "2026-11-25",
        "time": time,
        "command": "python -m benchmarks.step --workload target",
        "model": "SmolLM2-135M-Instruct",
        "precision": "bf16",
        "threads": 2,
        "steps": 40,
        "warmup": 2,
        "block": 3,
        "machine": {"cpu": "AMD EPYC", "cores": 2, "avx512_bf16": True, "isa_limits": {}},
        "matmul_peak_gflops": {"bfloat16": 415.0},
        "memory_bandwidth_gbs": 52.8,
        "load_average_start": [1.5, 1.0, 1.0],
        "load_average_end": [2.0, 2.0, 2.0],
        "workload": {
            "name": "target",
            "prompts_per_step": 4,
            "group_size": 8,
            "max_new_tokens": 48,
            "lr": 2e-5,
            "target_window": 3,
            "target_reward": 0.9,
            "seeds": list(seeds_default),
        },
        "per_seed": per_seed,
    }


A = _payload(
    {
        "0": {"rlvr": _run(20, 300.0, 15.0), "trl": _run(26, 800.0, 30.0)},
        "1": {"rlvr": _run(24, 360.0, 15.0), "trl": _run(24, 720.0, 30.0)},
    }
)
# a later run with other seeds (its workload's default seed list differs: that is fine) and a
# side the first file lacks
B = _payload(
    {
        "2": {
            "rlvr": _run(22, 330.0, 15.0),
            "trl": _run(18, 540.0, 30.0),
            "trl-whole": _run(19, 500.0, 26.0),
        }
    },
    seeds_default=(5, 6),
    time="10:00:00",
)


def _write(tmp_path, name, payload):
    path = tmp_path / name
    path.write_text(json.dumps(payload))
    return path


def test_merged_spreads_by_hand(tmp_path):
    merged = merge_seeds.merge([_write(tmp_path, "a.json", A), _write(tmp_path, "b.json", B)])
    assert list(merged["per_seed"]) == ["0", "1", "2"]
    over = merged["over_seeds"]
    # rlvr's steps to target 20, 24, 22 -> median 22 over three runs from two files
    assert over["rlvr"]["runs"] == 3 and over["rlvr"]["steps_to_target"]["median"] == 22
    # each ratio pairs one file's runs: 300/800, 360/720, 330/540 -> median 0.5
    vs = over["rlvr"]["vs_peer"]["seconds_to_target"]
    assert vs["values"] == pytest.approx([0.375, 0.5, 330 / 540]) and vs["median"] == 0.5
    # TRL's whole-batch side ran in one file only: summarised over its one seed
    assert over["trl-whole"]["runs"] == 1
    assert over["trl-whole"]["vs_peer"]["step_time_median_s"]["median"] == pytest.approx(26 / 30)
    assert [s["seeds"] for s in merged["sources"]] == [[0, 1], [2]]
    assert merged["sources"][1]["sides"] == ["rlvr", "trl", "trl-whole"]
    text = merge_seeds.render(merged)
    assert "seeds 0, 1, 2 pooled from 2 runs" in text
    assert "| steps to target | 22 [20-24] | 24 [18-26] | 19 [19-19] |" in text
    # the peak of the precision trained in: float32 runs (an AVX2-only CPU) show theirs
    assert "| bf16 415 GFLOP/s, 52.8 GB/s | 1.50 -> 2.00 |" in text
    fp32 = [copy.deepcopy(A), copy.deepcopy(B)]
    for payload in fp32:
        payload["precision"] = "float32"
        payload["matmul_peak_gflops"] = {"bfloat16": 415.0, "float32": 198.0}
    paths = [_write(tmp_path, f"fp{i}.json", x) for i, x in enumerate(fp32)]
    assert "| float32 198 GFLOP/s, 52.8 GB/s |" in merge_seeds.render(merge_seeds.merge(paths))


def test_refuses_a_seed_twice_and_different_settings(tmp_path):
    a = _write(tmp_path, "a.json", A)
    again = _write(tmp_path, "again.json", _payload({"1": A["per_seed"]["1"]}))
    with pytest.raises(ValueError, match=r"seed 1 is in both .*a\.json and .*again\.json"):
        merge_seeds.merge([a, again])
    other = copy.deepcopy(B)
    other["precision"] = "float32"
    with pytest.raises(ValueError, match=r'fp\.json: precision is "float32", .*a\.json has "bf16"'):
        merge_seeds.merge([a, _write(tmp_path, "fp.json", other)])
    other = copy.deepcopy(B)
    other["workload"]["max_new_tokens"] = 64
    with pytest.raises(ValueError, match=r"long\.json: workload is .*\"max_new_tokens\": 64"):
        merge_seeds.merge([a, _write(tmp_path, "long.json", other)])
    single = _payload({})
    del single["per_seed"]
    with pytest.raises(ValueError, match="no per-seed runs and no one-seed run"):
        merge_seeds.merge([a, _write(tmp_path, "one.json", single)])


def test_a_one_seed_file_counts_as_its_seed(tmp_path):
    # a run of one seed keeps its sides at the top level, beside "seed"
    one = _payload({})
    del one["per_seed"]
    one["seed"] = 7
    one["sides"] = {"rlvr": _run(30, 450.0, 15.0), "trl": _run(20, 600.0, 30.0)}
    merged = merge_seeds.merge([_write(tmp_path, "a.json", A), _write(tmp_path, "one.json", one)])
    assert list(merged["per_seed"]) == ["0", "1", "7"]
    assert merged["sources"][1]["seeds"] == [7]
    # rlvr steps 20, 24, 30: median 24; same-seed step ratios 20/26, 1, 30/20: median 1
    over = merged["over_seeds"]["rlvr"]
    assert over["steps_to_target"]["median"] == 24
    assert over["vs_peer"]["steps_to_target"]["median"] == pytest.approx(1.0)
    # fewer in seed 0, as many in seed 1, more in seed 7
    assert over["steps_sign_test"] == {"fewer": 1, "equal": 1, "more": 1, "p": 1.0}
    # the seed is still counted once: the same one-seed file twice is refused
    with pytest.raises(ValueError, match="seed 7 is in both"):
        merge_seeds.merge([_write(tmp_path, "b.json", one), _write(tmp_path, "c.json", one)])


def test_the_command_writes_real_files_and_exits_2_on_bad_input(tmp_path, capsys):
    a, b = _write(tmp_path, "a.json", A), _write(tmp_path, "b.json", B)
    out = tmp_path / "out" / "merged"
    assert merge_seeds.main([str(a), str(b), "--out", str(out)]) == 0
    saved = json.loads(out.with_suffix(".json").read_text())
    assert saved["over_seeds"]["rlvr"]["steps_to_target"]["median"] == 22
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "(merged.png)" in out.with_suffix(".md").read_text()
    assert merge_seeds.main([str(a), str(a), "--out", str(out)]) == 2
    assert "seed 0 is in both" in capsys.readouterr().err


def test_an_emulated_machine_says_so(tmp_path):
    # runs with the instruction set capped (an AVX2-only CPU emulated) must not read as AVX512
    a, b = copy.deepcopy(A), copy.deepcopy(B)
    for p in (a, b):
        p["machine"]["isa_limits"] = {"ONEDNN_MAX_CPU_ISA": "AVX2"}
        p["precision"] = "float32"
        p["matmul_peak_gflops"] = {"float32": 181.0}
    merged = merge_seeds.merge([_write(tmp_path, "a.json", a), _write(tmp_path, "b.json", b)])
    md = merge_seeds.render(merged)
    assert "AVX512-BF16: yes (instruction set capped: ONEDNN_MAX_CPU_ISA=AVX2); precision" in md
    assert "instruction set capped" not in merge_seeds.render(
        merge_seeds.merge([_write(tmp_path, "c.json", A), _write(tmp_path, "d.json", B)])
    )
