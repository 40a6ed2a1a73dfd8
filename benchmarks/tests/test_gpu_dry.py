"""The GPU benchmark's CPU dry mode end to end (so the script cannot rot between GPU sessions):
a real run of ``python -m benchmarks.gpu.bench --dry`` in its own process, and the tables it
writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
