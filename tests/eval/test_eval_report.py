"""`rlvr report` shows each run's evaluation before training against its last one, with how they
were measured, and warns, naming the field, when runs side by side (or evals within one run) were
measured differently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.telemetry.report import write_report

PROV = {"engine": "hf", "dtype": "float32", "batch_size": 64, "max_new_tokens": 48}


def fake_run(root: Path, name: str, provenances: list[dict]) -> Path:
    run = root / name
    (run / "eval").mkdir(parents=True)
    lines = []
    for step, prov in enumerate(provenances):
        results = {
            "heldout": {
                "greedy_pass@1": 0.5 + step / 10,
                "greedy/truncated_frac": 0.25,
                "greedy/mean_reply_tokens": 31.5,
            }
        }
        payload = {
            "step": step,
            "provenance": prov,
            "modes": {"heldout": [{"mode": "greedy", "k": 1, "temperature": 0.0, "top_p": 1.0}]},
            "results": results,
            "records": {"heldout": {"greedy": [{}] * 4}},
        }
        (run / "eval" / f"step_{step:06d}.json").write_text(json.dumps(payload))
        lines.append(
            {"step": step, "eval/heldout/greedy_pass@1": 0.5 + step / 10, "eval/provenance": prov}
        )
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    return run


def test_report_eval_table_and_provenance_warnings(tmp_path, capsys: pytest.CaptureFixture) -> None:
    a = fake_run(tmp_path, "a", [PROV, PROV])
    b = fake_run(tmp_path, "b", [PROV, {**PROV, "dtype": "bfloat16"}])
    page = write_report([a, b], tmp_path / "out").read_text()
    err = capsys.readouterr().err
    assert "Evaluation: before training -> the last evaluation" in page
    # the row: before (step 0), after (step 1), the change, then truncation and length before
    # -> after beside the mode, k, temperature, top-p and problem count
    row = (
        "<td>heldout greedy_pass@1</td><td>0.5000</td><td>0.6000</td><td>+0.1000</td>"
        "<td>0.2500 -&gt; 0.2500</td><td>31.5 -&gt; 31.5</td><td>greedy</td><td>1</td><td>0</td>"
        "<td>1</td><td>4</td><td>1</td><td>hf, float32</td>"
    )
    assert row in page
    assert "<td>hf, bfloat16</td>" in page
    # across runs and within run b: the dtype field is named, on the page and on stderr
    across = "b was measured differently from a: dtype: &#x27;float32&#x27; vs &#x27;bfloat16&#x27;"
    assert across in page
    assert "b: the eval at step 1 was measured differently from step 0: dtype" in err
    assert "a: the eval" not in err  # run a's evals agree


def test_report_of_runs_measured_alike_has_no_warning(tmp_path, capsys) -> None:
    a = fake_run(tmp_path, "a", [PROV])
    b = fake_run(tmp_path, "b", [PROV])
    write_report([a, b], tmp_path / "out")
    assert "measured differently" not in capsys.readouterr().err


def test_one_evaluation_has_no_before_column_value(tmp_path) -> None:
    a = fake_run(tmp_path, "a", [PROV])
    page = write_report([a], tmp_path / "out").read_text()
    assert "<td>heldout greedy_pass@1</td><td>-</td><td>0.5000</td><td>-</td>" in page
