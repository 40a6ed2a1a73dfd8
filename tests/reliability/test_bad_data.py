"""Malformed dataset rows: rejected before training with a message naming file, line and field,
or skipped and counted when told to skip; never a traceback from inside the training loop."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from reliability.bad_rows import Line, file_bytes, lines
from reliability.figures import add
from rlvr.cli.main import main as cli_main
from rlvr.data.loaders import DataError, load_rows, load_rows_with_report
from rlvr.training.batching import PromptSampler

FILE = "train.jsonl"


def numbered(file_lines: list[Line]) -> list[tuple[int, Line]]:
    """(1-based line number, line) of the non-blank lines."""
    return [(n, line) for n, line in enumerate(file_lines, start=1) if not line.blank]


def write(folder: Path, file_lines: list[Line]) -> Path:
    path = folder / FILE
    path.write_bytes(file_bytes(file_lines))
    return path


@settings(max_examples=150, deadline=None)
@given(lines(min_bad=1))
def test_the_first_bad_line_is_rejected_naming_file_line_and_field(file_lines) -> None:
    first_number, first_bad = next((n, ln) for n, ln in numbered(file_lines) if ln.kind)
    with tempfile.TemporaryDirectory() as folder:
        path = write(Path(folder), file_lines)
        with pytest.raises(DataError) as caught:
            load_rows(path)
    message = str(caught.value)
    assert message.startswith(f"{path} line {first_number}: "), message
    if first_bad.field is not None:
        assert f"field '{first_bad.field}'" in message, message
    add("bad_data", malformed_files_tried=1, rejected_naming_file_line=1)


@settings(max_examples=150, deadline=None)
@given(lines())
def test_skip_mode_keeps_the_good_rows_and_counts_the_bad(file_lines) -> None:
    rows_in = numbered(file_lines)
    good = [(n, ln) for n, ln in rows_in if ln.kind is None]
    bad = [(n, ln) for n, ln in rows_in if ln.kind is not None]
    with tempfile.TemporaryDirectory() as folder:
        path = write(Path(folder), file_lines)
        if not good:
            with pytest.raises(DataError, match="no usable rows"):
                load_rows_with_report(path, on_bad_row="skip")
            return
        rows, report = load_rows_with_report(path, on_bad_row="skip")
    assert [r["prompt"] for r in rows] == [ln.prompt for _, ln in good]
    assert [r["_source"] for r in rows] == [f"{FILE}:{n}" for n, _ in good]
    assert [(b.source, b.kind) for b in report.skipped] == [
        (f"{FILE}:{n}", ln.kind) for n, ln in bad
    ]
    assert report.records_read == len(rows_in)
    add("bad_data", rows_skipped_and_counted=len(bad))


@settings(max_examples=40, deadline=None)
@given(lines())
def test_data_prepare_with_skip_bad_rows_counts_them_in_the_manifest(file_lines) -> None:
    """`rlvr data prepare --skip-bad-rows` is where a config says to skip: the manifest's load
    stage counts every skipped line by kind."""
    good = [ln for _, ln in numbered(file_lines) if ln.kind is None]
    bad = Counter(ln.kind for _, ln in numbered(file_lines) if ln.kind is not None)
    with tempfile.TemporaryDirectory() as folder:
        path = write(Path(folder), file_lines)
        out = Path(folder) / "out"
        argv = ["data", "prepare", "--input", str(path), "--out", str(out), "--splits",
                "train=1.0", "--any-answer", "--skip-bad-rows"]  # fmt: skip
        code = cli_main(argv)
        if not good:
            assert code == 1  # no usable rows: a DataError, reported without a traceback
            return
        assert code == 0
        load = json.loads((out / "manifest.json").read_text())["stages"][0]
    assert load["name"] == "load"
    assert (load["kept"], load["dropped"]) == (len(good), sum(bad.values()))
    assert load["dropped_by_kind"] == dict(bad)
    add("bad_data", prepare_manifests_checked=1)


def train_argv(model_dir: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        f"model.name_or_path={model_dir}",
        "data.task=file",
        f"data.train_path={data}",
        "data.template=none",
        f"train.output_dir={out}",
        "train.run_name=bad-data",
        "rollout.max_new_tokens=4",
        "logging.progress=false",
        "algo.group_size=2",
        "algo.prompts_per_step=2",
        "train.threads=1",
        *extra,
    ]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(file_lines=lines(min_bad=1))
def test_rlvr_train_refuses_a_bad_file_before_training(
    file_lines, tiny_model_dir, capsys, restore_threads
) -> None:
    first_number = next(n for n, ln in numbered(file_lines) if ln.kind)
    with tempfile.TemporaryDirectory() as folder:
        path = write(Path(folder), file_lines)
        out = Path(folder) / "runs"
        capsys.readouterr()
        code = cli_main(train_argv(tiny_model_dir, path, out))
        err = capsys.readouterr().err
        assert code == 2
        assert f"{path} line {first_number}: " in err
        assert "Traceback" not in err
        assert not (out / "bad-data" / "metrics.jsonl").exists()  # nothing was trained
    add("bad_data", train_runs_refused_before_training=1)


@pytest.mark.parametrize("field", ["prompt", "answer"])
def test_a_lone_surrogate_escape_is_rejected_naming_line_and_field(
    field, tiny_model_dir, tmp_path, capsys, restore_threads
) -> None:
    """JSON may spell a lone UTF-16 surrogate ("\\ud800"); Python reads it into a str that no
    tokenizer or UTF-8 writer accepts. The loader must refuse that row, not the training step."""
    rows = [{"prompt": f"question {i}", "answer": str(i)} for i in range(4)]
    text = "\n".join(json.dumps(r) for r in rows) + "\n"
    # line 3's field gets the escape (json.dumps would write a real character, so edit the text)
    lines_ = text.splitlines()
    lines_[2] = lines_[2].replace(f'"{rows[2][field]}"', f'"{rows[2][field]} \\ud800"')
    path = tmp_path / FILE
    path.write_text("\n".join(lines_) + "\n")
    with pytest.raises(DataError) as caught:
        load_rows(path)
    assert str(caught.value).startswith(f"{path} line 3: ")
    assert f"field '{field}'" in str(caught.value)

    code = cli_main(train_argv(tiny_model_dir, path, tmp_path / "runs"))
    err = capsys.readouterr().err
    assert code == 2 and f"{path} line 3" in err and "Traceback" not in err
    assert not (tmp_path / "runs" / "bad-data" / "metrics.jsonl").exists()


def test_a_prompt_longer_than_the_limit_is_refused_before_the_first_step(
    tiny_model_dir, tmp_path, capsys, restore_threads
) -> None:
    """data.max_prompt_tokens is a property of every row: a row that breaks it must stop the run
    before training starts, not at whichever step first samples it."""
    num_rows, per_step = 12, 2
    # The row the run's sampler (train.seed=0) draws last in the first epoch, at step 6 of 6,
    # gets the long prompt.
    sampler = PromptSampler(num_rows, per_step, seed=0)
    last_index = [sampler.next_indices() for _ in range(num_rows // per_step)][-1][-1]
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(num_rows)]
    rows[last_index]["prompt"] = "x" * 200  # 200 character tokens > 64
    path = tmp_path / FILE
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = train_argv(
        tiny_model_dir,
        path,
        tmp_path / "runs",
        "data.max_prompt_tokens=64",
        f"train.max_steps={num_rows // per_step}",
    )
    code = cli_main(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert f"{FILE}:{last_index + 1}" in err or f"line {last_index + 1}" in err
    assert "data.max_prompt_tokens" in err
    metrics = tmp_path / "runs" / "bad-data" / "metrics.jsonl"
    steps = (
        [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
        if metrics.exists()
        else []
    )
    assert all(step == 0 for step in steps), (
        f"the run trained steps {steps} before refusing the row"
    )
