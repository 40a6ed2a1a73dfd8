"""The `rlvr` command line: help with examples, and bad input stopped before training.

Each bad input must end with exit code 2 and one message that names the file, line, field or
value at fault, with no traceback, and must not leave a run directory that looks finished.
Most cases call `rlvr.cli.main` in this process (what `python -m rlvr` runs); one goes through
a real subprocess to check the exit code the shell sees.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.cli.main import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlvr", *args], capture_output=True, text=True, timeout=120
    )


def test_top_level_help_shows_examples_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out
    assert "rlvr train -c run.yaml algo.group_size=4 train.lr=2e-6" in out
    assert "3 stopped by the health gate" in out


@pytest.mark.parametrize(
    "command, example",
    [
        (["train"], "rlvr train -c run.yaml algo.group_size=4"),
        (["eval"], "rlvr eval runs/RUN --modes greedy,sampling --k 8"),
        (["data", "filter-difficulty"], "rlvr data filter-difficulty --model runs/RUN"),
    ],
)
def test_subcommand_help_shows_examples(
    command: list[str], example: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "example" in out and example in out


def no_finished_run(out_dir: Path) -> bool:
    """True when nothing under out_dir claims to be a finished run."""
    for status in out_dir.rglob("status.json"):
        if json.loads(status.read_text()).get("state") == "finished":
            return False
    return not any(out_dir.rglob("final"))


def bad_train(capsys: pytest.CaptureFixture[str], out: Path, *overrides: str) -> str:
    """Run `rlvr train` with overrides that must fail; return its one error message."""
    code = main(["train", f"train.output_dir={out}", "logging.progress=false", *overrides])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert "Traceback" not in captured.err
    assert captured.err.startswith("rlvr: ")
    assert captured.err.count("rlvr: ") == 1  # one message, not a cascade
    assert no_finished_run(out)
    return captured.err


def test_missing_dataset_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "train.jsonl"
    err = bad_train(capsys, tmp_path / "runs", "data.task=file", f"data.train_path={missing}")
    assert f"data.train_path: {missing}: no such file or folder" in err


def test_row_without_the_prompt_field_names_file_line_and_field(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text(
        json.dumps({"prompt": "What is 1 + 1?", "answer": "2"})
        + "\n"
        + json.dumps({"question": "What is 2 + 2?", "answer": "4"})
        + "\n"
    )
    err = bad_train(
        capsys,
        tmp_path / "runs",
        f"model.name_or_path={tiny_model_dir}",
        "data.task=file",
        f"data.train_path={data}",
    )
    assert str(data) in err and "line 2" in err and "'prompt'" in err


@pytest.mark.parametrize("kind", ["missing", "not_a_model"])
def test_unreadable_model_path(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / kind
    if kind == "not_a_model":
        model.mkdir()
        (model / "weights.bin").write_bytes(b"\0" * 16)
    err = bad_train(capsys, tmp_path / "runs", f"model.name_or_path={model}")
    assert "model.name_or_path" in err and str(model) in err
    if kind == "not_a_model":
        assert "has no config.json" in err


def test_invalid_config_value_names_field_and_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = bad_train(capsys, tmp_path / "runs", "train.lr=-1")
    assert "train.lr: Input should be greater than 0 (got -1)" in err


def test_contradictory_config_names_each_knob(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = bad_train(capsys, tmp_path / "runs", "algo.group_size=1")
    assert "algo.group_size=1: must be > 1" in err


def test_bad_config_file_names_the_file_and_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("train:\n  max_step: 5\n")
    code = main(["train", "-c", str(config), f"train.output_dir={tmp_path}/runs"])
    err = capsys.readouterr().err
    assert code == 2
    assert "unknown config key 'train.max_step'; did you mean 'train.max_steps'?" in err
    assert no_finished_run(tmp_path / "runs")


def test_unknown_key_through_the_real_command(tmp_path: Path) -> None:
    proc = run_cli("train", "train.learning_rate=1e-5", f"train.output_dir={tmp_path}/runs")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "rlvr: unknown config key 'train.learning_rate'; did you mean 'train.lr'?"
    )
    assert not (tmp_path / "runs").exists()


def test_overrides_may_come_before_between_and_after_options(capsys) -> None:
    from rlvr.cli.main import build_parser, parse_args_any_order

    argv = ["train", "a.b=1", "--resume", "runs/r", "c.d=2", "--nproc", "2", "a.b=3"]
    args = parse_args_any_order(build_parser(), argv)
    assert args.overrides == ["a.b=1", "c.d=2", "a.b=3"]  # order kept: the last a.b wins
    assert (args.resume, args.nproc) == ("runs/r", 2)
    for bad in (["train", "--resume", "r", "--bogus"], ["train", "a.b=1", "--nproc", "2", "oops"]):
        with pytest.raises(SystemExit):
            parse_args_any_order(build_parser(), bad)
        assert "unrecognized arguments" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command", [["--help"], ["train", "--help"], ["eval", "--help"], ["data", "--help"]]
)
def test_help_loads_neither_torch_nor_transformers(command: list[str]) -> None:
    """`rlvr ... --help` answers at once: a fresh interpreter that prints a help page has not
    imported torch or transformers (the data readers load the image code, and torch with it,
    only for rows with images)."""
    code = (
        "import sys\n"
        "from rlvr.cli.main import main\n"
        f"try:\n    main({command!r})\nexcept SystemExit:\n    pass\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-500:]


@pytest.mark.parametrize(
    "argv, said",
    [  # TRL's and HfArgumentParser's habit: --name value
        (["--learning_rate", "1e-6"], "write it as train.lr=1e-6"),
        (["--num_generations=8"], "write it as algo.group_size=8"),
        (["--train.max_steps", "3"], "write it as train.max_steps=3"),
        (["--no_such_knob", "3"], "settings are written section.key=value, without dashes"),
    ],
)
def test_a_setting_given_as_a_dashed_option_says_how_to_write_it(
    argv: list[str], said: str, capsys
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["config", *argv])
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err
