"""The GPU benchmark's CPU dry mode end to end (so the script cannot rot between GPU sessions):
a real run of ``python -m benchmarks.gpu.bench --dry`` in its own process, and the tables it
writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.harness.workloads import prompt_digest

ROOT = Path(__file__).resolve().parents[2]
SHAPES = ROOT / "benchmarks" / "gpu" / "shapes"


def test_the_dry_mode_runs_both_sides_and_writes_its_tables(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "benchmarks.gpu.bench", "--dry", "--out", str(tmp_path)]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    [json_file] = tmp_path.glob("gpu-*-dry.json")
    [md_file] = tmp_path.glob("gpu-*-dry.md")
    report = json.loads(json_file.read_text())
    assert report["dry"] and report["device"] == "cpu (dry mode)"
    assert report["bf16_peak_flops"] > 0
    shape = report["shapes"]["tiny"]
    rlvr = shape["sides"]["rlvr"]
    # equal work held: every reply exactly the workload's length (EOS beyond the model's rows)
    assert rlvr["completion_lens"] == [report["workload"]["reply_tokens"]] == [8]
    assert rlvr["measured_steps"] == 1 and rlvr["step_time_median_s"] > 0
    assert rlvr["phase_median_s"]["generate"] > 0 and rlvr["phase_median_s"]["update"] > 0
    assert rlvr["completion_tokens_per_step"] == 2 * 2 * 8
    text = md_file.read_text()
    for row in (
        "step time (s, median)",
        "generation (s, median)",
        "update (s, median)",
        "tokens/s",
        "peak GPU memory (GiB)",
        "update MFU",
    ):
        assert f"| {row}" in text, row
    if "trl" in shape["sides"]:  # TRL installed: its column and the ratios are filled
        assert shape["ratios_rlvr_over_trl"]["step_time_median_s"] > 0
        assert shape["sides"]["trl"]["prompt_digests"] == rlvr["prompt_digests"]
    else:  # otherwise the skip is said, in the table and the JSON
        assert "TRL's side skipped" in text
        assert any("TRL's side skipped" in n for n in report["notes"])
        assert shape["ratios_rlvr_over_trl"]["step_time_median_s"] is None


def test_the_gpu_worker_moves_the_step_counter_so_each_step_draws_its_own_seed(tmp_path):
    """The GPU worker drives rlvr's real loop: step k seeds from (train.seed, k) as `fit` does
    (a stuck counter reseeded every step alike)."""
    from benchmarks.gpu.bench import build_shape, side_spec
    from rlvr.training.step import step_seed
    from rlvr.training.tiny import build_fixed_length_tokenizer

    tok = build_fixed_length_tokenizer(json.loads((SHAPES / "tiny.json").read_text())["vocab_size"])
    model_dir = build_shape("tiny", tmp_path / "model", tok, "cpu")
    spec = side_spec("tiny", model_dir, tok, "cpu", prompts=2, group=2, new_tokens=4, micro=2, steps=3)
    spec.update(side="rlvr", work_dir=str(tmp_path / "rlvr"), padded=False)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}
    cmd = [sys.executable, "-m", "benchmarks.gpu.worker", "rlvr"]
    cmd += [str(tmp_path / "spec.json"), str(tmp_path / "result.json")]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    records = json.loads((tmp_path / "result.json").read_text())["records"]
    assert [r["torch_seed"] for r in records] == [step_seed(0, k) for k in range(3)]
    # and the prompts are the schedule's, step by step (the digests TRL's side is checked on)
    want = [prompt_digest([row["prompt"] for row in step]) for step in spec["schedule"]]
    assert [r["prompt_digest"] for r in records] == want
