"""`rlvr data prepare` through the parser that `register` builds (rlvr.cli.main may not exist yet)."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pytest

from rlvr.cli.data import cmd_prepare, parse_splits, register


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlvr")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def write_input(path: Path) -> Path:
    rows = [
        {"question": f"What is {i} times 3?", "label": 3 * i, "src": "synthetic"} for i in range(20)
    ]
    rows.append({"question": "AMC 10: what is 1 + 1?", "label": 2, "src": "AMC10"})
    rows.append({"question": "what is 0 times 3", "label": 0, "src": "synthetic"})  # dup of i=0
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_prepare_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = write_input(tmp_path / "raw.jsonl")
    out = tmp_path / "prepared"
    args = build_parser().parse_args(
        [
            "data",
            "prepare",
            f"--input={source}",
            f"--out={out}",
            "--prompt-field=question",
            "--answer-field=label",
            "--source-field=src",
            "--exclude-sources",
            "AMC|AIME",
            "--splits",
            "train=0.75,test=0.25",
            "--seed=3",
        ]
    )
    assert args.func is cmd_prepare
    assert args.func(args) == 0

    manifest = json.loads((out / "manifest.json").read_text())
    # 22 rows -> 21 without AMC -> 20 after the duplicate of "What is 0 times 3?";
    # train floor(0.75 * 20) = 15, test floor(0.25 * 20) = 5, nothing left over
    assert manifest["stages"][-1] == {"name": "split", "kept": 20, "dropped": 0}
    assert {n: s["rows"] for n, s in manifest["splits"].items()} == {"train": 15, "test": 5}
    for info in manifest["splits"].values():
        assert info["sha256"] == hashlib.sha256((out / info["file"]).read_bytes()).hexdigest()
    assert manifest["options"]["source_field"] == "src"
    assert manifest["options"]["answers"] == "integer"  # default from PrepareConfig
    printed = capsys.readouterr().out
    assert "exclude_sources" in printed and "train: 15 rows" in printed


def test_prepare_reports_data_errors_with_exit_code_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = build_parser().parse_args(
        ["data", "prepare", "--input", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path)]
        + ["--splits", "train=5"]
    )
    assert cmd_prepare(args) == 1
    assert "missing.jsonl: no such file" in capsys.readouterr().err


def test_prepare_reports_config_errors_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write_input(tmp_path / "raw.jsonl")
    args = build_parser().parse_args(
        ["data", "prepare", "--input", str(source), "--out", str(tmp_path / "o")]
        + ["--splits", "train=0.9,test=0.2"]
    )
    assert cmd_prepare(args) == 2
    assert "fractions sum to 1.1" in capsys.readouterr().err


def test_parse_splits() -> None:
    assert parse_splits("train=1000,test=200") == {"train": 1000, "test": 200}
    parsed = parse_splits("train=0.9, test=0.1")
    assert parsed == {"train": 0.9, "test": 0.1} and isinstance(parsed["train"], float)
    for bad, message in [
        ("train", "write NAME=SIZE"),
        ("train=ten", "bad size 'ten' for split 'train'"),
        ("a=1,a=2", "split 'a' given twice"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            parse_splits(bad)


def test_bad_splits_flag_exits_with_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(
            ["data", "prepare", "--input", "x", "--out", "y", "--splits", "t"]
        )
    assert exit_info.value.code == 2
    assert "write NAME=SIZE" in capsys.readouterr().err


def test_help_shows_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["data", "prepare", "--help"])
    text = capsys.readouterr().out
    assert "example:" in text and "--splits train=1000,test=200" in text
    assert "(default: 'prompt')" in text
