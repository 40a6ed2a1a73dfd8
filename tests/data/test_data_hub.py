"""Hub-layout dataset folders and hub ids (rlvr.data.hub): one `load_dataset` path, offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.data.hub import HubUnreachable, parse_source
from rlvr.data.loaders import DataError, load_rows
from rlvr.training.preflight.checks import config_problems

CARD = """---
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-*.parquet
  - split: test
    path: data/test-*.parquet
---
# A fixture dataset in hub layout
"""


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No network and a private cache: what a machine without the hub sees."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


def parquet_folder(root: Path) -> Path:
    """A hub-layout folder: README card naming two splits of parquet files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "data").mkdir(parents=True)
    (root / "README.md").write_text(CARD)
    train = {"question": ["1+1?", "2+2?", "3+3?"], "solution": ["2", "4", "6"]}
    pq.write_table(pa.table(train), root / "data" / "train-00000-of-00001.parquet")
    test = {"question": ["5+5?"], "solution": ["10"]}
    pq.write_table(pa.table(test), root / "data" / "test-00000-of-00001.parquet")
    return root


def json_folder(root: Path, rows: list[dict], split: str = "test") -> Path:
    """A hub-layout folder of one JSON-lines split (file name gives the split)."""
    root.mkdir(parents=True)
    (root / "README.md").write_text("# fixture\n")
    (root / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_parquet_folder_by_split(tmp_path: Path) -> None:
    folder = parquet_folder(tmp_path / "arith")
    kw = dict(prompt_field="question", answer_field="solution")
    rows = load_rows(f"{folder}?split=train", **kw)
    assert [(r["prompt"], r["answer"], r["_source"]) for r in rows] == [
        ("1+1?", "2", "arith/train:0"),
        ("2+2?", "4", "arith/train:1"),
        ("3+3?", "6", "arith/train:2"),
    ]
    assert [r["answer"] for r in load_rows(folder, split="test", **kw)] == ["10"]
    with pytest.raises(DataError, match=r"several splits: .*\(one of: test, train\)"):
        load_rows(folder, **kw)
    with pytest.raises(DataError, match=r"unknown split 'dev'|Unknown split \"dev\""):
        load_rows(f"{folder}?split=dev", **kw)


def test_streaming_folder_stops_at_the_limit(tmp_path: Path) -> None:
    folder = parquet_folder(tmp_path / "arith")
    rows = load_rows(
        f"{folder}?split=train&streaming=true",
        prompt_field="question",
        answer_field="solution",
        limit=2,
    )
    assert [r["prompt"] for r in rows] == ["1+1?", "2+2?"]


def test_gsm8k_answer_extraction(tmp_path: Path) -> None:
    rows = [
        {"question": "Q1", "answer": "She has 3 + 4 = <<3+4=7>>7 apples.\n#### 7"},
        {"question": "Q2", "answer": "1000 * 1 = 1000\n#### 1,000"},
    ]
    folder = json_folder(tmp_path / "gsm8k", rows)
    out = load_rows(folder, prompt_field="question", answer_extract="gsm8k")
    assert [r["answer"] for r in out] == ["7", "1000"]
    bad = json_folder(tmp_path / "bad", [*rows, {"question": "Q3", "answer": "no marker, 5"}])
    with pytest.raises(DataError, match=r"bad row 2: answer field 'answer' has no '#### answer'"):
        load_rows(bad, prompt_field="question", answer_extract="gsm8k")


def test_boxed_answer_extraction_keeps_nested_braces(tmp_path: Path) -> None:
    rows = [
        {"problem": "P1", "solution": "So $x = \\boxed{\\frac{1}{2}}$."},
        {"problem": "P2", "solution": "First \\boxed{3}, then \\boxed{4}."},
    ]
    folder = json_folder(tmp_path / "math", rows)
    out = load_rows(folder, prompt_field="problem", answer_field="solution", answer_extract="boxed")
    assert [r["answer"] for r in out] == ["\\frac{1}{2}", "4"]


def test_a_folder_and_a_hub_id_take_the_same_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datasets

    folder = json_folder(tmp_path / "set", [{"prompt": "p", "answer": "1"}])
    real = datasets.load_dataset
    calls: list[tuple] = []

    def spy(location: str, **kw: object):
        calls.append((location, kw))
        return real(str(folder), split="test")  # the hub id reads the fixture's rows

    monkeypatch.setattr(datasets, "load_dataset", spy)
    rows = load_rows("hf:owner/set?config=main&split=test&revision=abc123")
    assert [r["_source"] for r in rows] == ["set/test:0"]
    load_rows(f"{folder}?split=test")
    assert calls == [
        ("owner/set", dict(name="main", split="test", revision="abc123", streaming=False)),
        (str(folder), dict(name=None, split="test", revision=None, streaming=False)),
    ]


def test_unreachable_hub_id_says_how_to_work_offline() -> None:
    with pytest.raises(HubUnreachable) as err:
        load_rows("hf:no-such-owner/no-such-set?split=train")
    text = str(err.value)
    assert "hub dataset 'no-such-owner/no-such-set' could not be loaded" in text
    assert "HF_HUB_OFFLINE=1" in text and "local folder" in text
    assert text.count("\n") == 0  # one line


def test_parse_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"unknown option 'splt'; known: split, config"):
        parse_source("hf:owner/name?splt=train")
    with pytest.raises(DataError, match=r"a hub id looks like hf:owner/name"):
        parse_source("hf:a/b/c")
    with pytest.raises(DataError, match=r"nope: no such file or folder \(a hub dataset is"):
        parse_source(tmp_path / "nope")
    f = tmp_path / "rows.jsonl"
    f.write_text('{"prompt": "p", "answer": "1"}\n')
    with pytest.raises(DataError, match=r"split='train' applies to a dataset folder or hub id"):
        load_rows(f, split="train")


def test_config_accepts_hub_ids_and_names_a_missing_folder(tmp_path: Path) -> None:
    from rlvr.config import load_config

    cfg = load_config(None, ["data.task=file", "data.train_path=hf:openai/gsm8k?config=main"])
    assert config_problems(cfg) == []  # a hub id is checked when read, not by validation
    missing = tmp_path / "gone"
    cfg = load_config(None, ["data.task=file", f"data.train_path={missing}?split=train"])
    assert config_problems(cfg) == [
        f"data.train_path: {missing}?split=train: no such file or folder "
        "(a hub dataset is written hf:owner/name?split=...)"
    ]


def test_dry_run_offline_with_a_hub_id_says_what_it_did_not_check(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlvr.cli.main import main

    argv = [
        "train",
        "--dry-run",
        f"model.name_or_path={tiny_model_dir}",
        "data.task=file",
        "data.train_path=hf:no-such-owner/no-such-set?split=train",
        "data.template=none",
        f"train.output_dir={tmp_path / 'runs'}",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "train rows: 0; eval rows: 0 (data not read)" in out
    assert "not checked: data not read: hub dataset 'no-such-owner/no-such-set'" in out
    assert out.rstrip().endswith("dry run OK: nothing was trained")


def test_training_on_an_unreachable_hub_id_is_one_error_line(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlvr.cli.main import main

    argv = [
        "train",
        f"model.name_or_path={tiny_model_dir}",
        "data.task=file",
        "data.train_path=hf:no-such-owner/no-such-set?split=train",
        "data.template=none",
        "logging.progress=false",
        f"train.output_dir={tmp_path / 'runs'}",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("rlvr: ") == 1 and "Traceback" not in err
    assert "hub dataset 'no-such-owner/no-such-set' could not be loaded" in err
    assert "HF_HUB_OFFLINE=1" in err


def test_a_misspelt_data_file_gets_the_file_beside_it(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "train.jsonl").write_text('{"prompt": "p", "answer": "1"}\n')
    with pytest.raises(DataError, match=r"did you mean '.*train\.jsonl'\?"):
        parse_source(tmp_path / "trian.jsonl")
    monkeypatch.chdir(tmp_path)  # a relative path: read from the directory rlvr runs in
    with pytest.raises(DataError) as err:
        parse_source("train.jsonll")
    assert "did you mean 'train.jsonl'?" in str(err.value)
    assert f"relative to {tmp_path}" in str(err.value)
