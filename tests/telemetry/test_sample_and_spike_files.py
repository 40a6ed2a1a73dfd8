"""write_samples and SpikeLog on real files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlvr.telemetry import SpikeLog, list_sample_steps, prompt_hash, read_samples, write_samples


def test_samples_file_name_and_content(tmp_path: Path) -> None:
    records = [
        {"prompt": "2+2?", "response": "4", "reward": 1.0},
        {"prompt": "2+2?", "response": "five", "reward": math.nan},
    ]
    path = write_samples(tmp_path, 10, records)
    assert path == tmp_path / "samples" / "step_000010.jsonl"
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"prompt": "2+2?", "response": "4", "reward": 1.0},
        {"prompt": "2+2?", "response": "five", "reward": "NaN"},
    ]
    back = read_samples(tmp_path, 10)
    assert back[0] == records[0] and math.isnan(back[1]["reward"])


def test_rewriting_a_step_replaces_it_and_steps_are_listed(tmp_path: Path) -> None:
    write_samples(tmp_path, 3, [{"r": 1}])
    write_samples(tmp_path, 120, [{"r": 2}])
    write_samples(tmp_path, 3, [{"r": 3}, {"r": 4}])
    (tmp_path / "samples" / "notes.txt").write_text("not a sample file")
    assert list_sample_steps(tmp_path) == [3, 120]
    assert read_samples(tmp_path, 3) == [{"r": 3}, {"r": 4}]
    assert read_samples(tmp_path, 7) == []


def test_samples_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="step"):
        write_samples(tmp_path, -1, [])
    with pytest.raises(TypeError, match=r"records\[1\]"):
        write_samples(tmp_path, 0, [{"a": 1}, "not a dict"])


def test_prompt_hash_is_sha256_prefix() -> None:
    # SHA-256 test vectors (FIPS 180-2): "abc" -> ba7816bf8f01cfea..., "" -> e3b0c44298fc1c14...
    assert prompt_hash("abc") == "ba7816bf8f01"
    assert prompt_hash("") == "e3b0c44298fc"


def test_spike_log_records_only_above_threshold(tmp_path: Path) -> None:
    spikes = SpikeLog(tmp_path, threshold=50.0)
    stats = {"log_ratio_max": 7.0, "ratio_max": 1096.6, "adv_std": 0.9, "reward_mean": 0.5}
    assert spikes.maybe_record(1, 49.9, stats, ["abc"]) is False
    assert spikes.maybe_record(2, 50.0, stats, ["abc"]) is False  # strictly above
    assert not (tmp_path / "spikes.jsonl").exists()
    assert spikes.maybe_record(3, 412.0, stats, ["abc", ""]) is True
    (record,) = [json.loads(line) for line in (tmp_path / "spikes.jsonl").read_text().splitlines()]
    assert record == {
        "step": 3,
        "grad_norm": 412.0,
        "threshold": 50.0,
        # reward_mean is not about the update, so it is dropped
        "stats": {"log_ratio_max": 7.0, "ratio_max": 1096.6, "adv_std": 0.9},
        "num_prompts": 2,
        "prompt_hashes": ["ba7816bf8f01", "e3b0c44298fc"],
    }


def test_nonfinite_grad_norm_is_a_spike(tmp_path: Path) -> None:
    spikes = SpikeLog(tmp_path)
    assert spikes.maybe_record(5, math.nan, {}, ["p"]) is True
    assert spikes.maybe_record(6, math.inf, {}, ["p"]) is True
    assert '"grad_norm": "NaN"' in (tmp_path / "spikes.jsonl").read_text()
    first, second = spikes.read()
    assert math.isnan(first["grad_norm"]) and second["grad_norm"] == math.inf


@pytest.mark.parametrize("threshold", [0.0, -1.0, math.nan, math.inf])
def test_spike_threshold_must_be_positive_and_finite(tmp_path: Path, threshold: float) -> None:
    with pytest.raises(ValueError, match="threshold"):
        SpikeLog(tmp_path, threshold=threshold)
