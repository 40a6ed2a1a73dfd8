"""What the checks against TRL share: their arguments and the files they write."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks.studies.vs_trl import add_common_args, resolve, write_results


def test_results_are_the_payload_and_its_rendering(tmp_path, capsys):
    stem = tmp_path / "new-dir" / "2026-01-01-check-float32"
    payload = {"runs": [{"seed": 3, "x": 0.5}]}
    write_results(stem, payload, lambda d: f"seeds: {[r['seed'] for r in d['runs']]}\n")
    assert json.loads(stem.with_suffix(".json").read_text()) == payload
    assert stem.with_suffix(".md").read_text() == "seeds: [3]\n"
    assert "seeds: [3]" in capsys.readouterr().out


def test_common_arguments_and_a_bad_seed_list(tmp_path, capsys):
    p = argparse.ArgumentParser()
    add_common_args(p, precision="float32", seeds_help="seeds")
    args = p.parse_args(["--out", str(tmp_path), "--seeds", "0,x"])
    assert (args.precision, args.threads, args.no_install) == ("float32", 2, False)
    with pytest.raises(SystemExit):
        resolve(p, args, "check")
    assert "'x' is not an integer" in capsys.readouterr().err
