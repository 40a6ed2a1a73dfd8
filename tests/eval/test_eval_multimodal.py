"""`rlvr eval` on image sets through the training path: the shapes held-out split and a data
file whose rows carry image paths (relative to the file), on a run of the tiny VLM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("PIL.Image")

from rlvr.cli.main import main  # noqa: E402
from rlvr.config import load_config  # noqa: E402
from rlvr.training.trainer import Trainer  # noqa: E402

COLOURS = ["red", "blue", "green"]


def write_image_file(folder: Path, colours: list[str]) -> Path:
    """figs/<i>.png (one flat colour each) and rows.jsonl naming them by relative path."""
    from PIL import Image

    (folder / "figs").mkdir(parents=True, exist_ok=True)
    lines = []
    for i, colour in enumerate(colours):
        Image.new("RGB", (56, 56), colour).save(folder / "figs" / f"{i}.png")
        row = {"prompt": "Which colour is it?", "answer": str(i), "images": [f"figs/{i}.png"]}
        lines.append(json.dumps(row) + "\n")
    path = folder / "rows.jsonl"
    path.write_text("".join(lines))
    return path


@pytest.fixture(scope="module")
def vlm_run(tiny_vlm_dir: Path, tmp_path_factory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("vlm_run")
    probe = write_image_file(out / "probe", COLOURS)
    cfg = load_config(
        None,
        [
            f"model.name_or_path={tiny_vlm_dir}",
            f"train.output_dir={out}",
            "train.run_name=vlm",
            "data.task=shapes",
            "data.num_train=4",
            "data.num_eval=3",
            "algo.prompts_per_step=2",
            "algo.group_size=2",
            "rollout.max_new_tokens=6",
            "rollout.engine=hf",
            "train.max_steps=1",
            "logging.progress=false",
            f"eval.sets=[{{name: heldout}}, {{name: figs, path: {probe}}}]",
        ],
    )
    return Path(Trainer(cfg).fit()["run_dir"]), probe


def test_offline_eval_of_a_vlm_run_matches_its_in_training_eval(vlm_run, tmp_path) -> None:
    run_dir, _ = vlm_run
    in_training = json.loads((run_dir / "eval" / "step_000001.json").read_text())
    records = in_training["records"]
    assert len(records["heldout"]["greedy"]) == 3 and len(records["figs"]["greedy"]) == 3
    assert [r["prompt"] for r in records["figs"]["greedy"]] == ["Which colour is it?"] * 3
    out = tmp_path / "offline.json"
    assert main(["eval", str(run_dir), "--out", str(out)]) == 0
    offline = json.loads(out.read_text())
    # the final folder loads as a VLM with its processor; every reply is the in-training one
    assert offline["records"] == records
    assert offline["results"] == in_training["results"]


def test_eval_of_an_image_file_reads_the_images(vlm_run, tmp_path) -> None:
    """--data with relative image paths: the same file evaluates as in the run; other pixels
    behind the same paths give other replies (the images reach the model)."""
    run_dir, probe = vlm_run
    same = tmp_path / "same.json"
    assert main(["eval", str(run_dir), "--data", str(probe), "--out", str(same)]) == 0
    want = json.loads((run_dir / "eval" / "step_000001.json").read_text())["records"]["figs"]
    assert json.loads(same.read_text())["records"]["rows"] == want
    other = write_image_file(tmp_path / "other", ["white", "black", "yellow"])
    moved = tmp_path / "moved.json"
    assert main(["eval", str(run_dir), "--data", str(other), "--out", str(moved)]) == 0
    replies = [r["responses"] for r in json.loads(moved.read_text())["records"]["rows"]["greedy"]]
    assert replies != [r["responses"] for r in want["greedy"]]


def test_missing_image_file_is_named_before_the_model_loads(vlm_run, tmp_path, capsys) -> None:
    run_dir, _ = vlm_run
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "Q?", "answer": "1", "images": ["nope.png"]}) + "\n")
    assert main(["eval", str(run_dir), "--data", str(bad), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert f"{bad} line 1: field 'images': no such file {tmp_path / 'nope.png'}" in err
    assert "Loading weights" not in err
