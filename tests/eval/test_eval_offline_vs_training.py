"""Offline `rlvr eval` and the in-training evaluator give the same per-problem records.

One tiny training run evaluates three named sets (held-out split, an ID probe from the train
split, an OOD probe file) in greedy and sampling modes after every step; `rlvr eval RUN_DIR`
then re-evaluates its final model from the run directory alone.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.cli.main import main
from rlvr.config import load_config
from rlvr.training.trainer import Trainer

SETS = ("heldout", "id_probe", "ood_probe")
METRICS = ("greedy_pass@1", "sampling_pass@2", "maj@2", "mean_acc@2")
REPLY_STATS = ("truncated_frac", "mean_reply_tokens")


def tiny_overrides(model_dir: Path, out: Path, *extra: str) -> list[str]:
    return [
        f"model.name_or_path={model_dir}",
        f"train.output_dir={out}",
        "data.template=none",
        "rollout.max_new_tokens=8",
        "logging.progress=false",
        "logging.samples_every=0",
        "train.threads=1",  # 2 cores shared with other work: one thread each is fastest
        "algo.group_size=4",
        "algo.prompts_per_step=2",
        "eval.max_problems=5",
        "reward.specs=[{name: 'eval_toy_rewards:first_char_even'}]",
        *extra,
    ]


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def first_char_even(text: str) -> bool:
    """The toy reward's rule, restated here to check the grades independently."""
    return bool(text) and ord(text[0]) % 2 == 0


@pytest.fixture(scope="module")
def probe_run(sharp_model_dir: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("probe_run")
    probe = out / "ood_probe.jsonl"
    probe.write_text(
        "".join(
            json.dumps({"prompt": f"What is {a} * {a + 3}?", "answer": str(a * (a + 3))}) + "\n"
            for a in range(10, 14)
        )
    )
    cfg = load_config(
        None,
        tiny_overrides(
            sharp_model_dir,
            out,
            "train.max_steps=2",
            "train.run_name=probes",
            "train.save_every=1",
            "eval.every=1",
            "eval.modes=[greedy, {kind: sampling, k: 2}]",
            f"eval.sets=[{{name: heldout}}, {{name: id_probe, split: train, max_problems: 3}}, "
            f"{{name: ood_probe, path: {probe}}}]",
        ),
    )
    return Path(Trainer(cfg).fit()["run_dir"])


def test_probe_sets_are_logged_under_their_names(probe_run: Path) -> None:
    lines = [m for m in read_metrics(probe_run) if any(k.startswith("eval/") for k in m)]
    assert [m["step"] for m in lines] == [0, 1, 2]  # before, then every step
    stats = [f"{m}/{x}" for m in ("greedy", "sampling") for x in REPLY_STATS]
    expected = {f"eval/{s}/{metric}" for s in SETS for metric in (*METRICS, *stats)}
    for line in lines:
        assert {k for k in line if k.startswith("eval/")} == expected | {"eval/provenance"}
        # how it was measured: eval.dtype auto is float32 on the CPU whatever the autocast
        assert line["eval/provenance"]["dtype"] == "float32"
        assert line["eval/provenance"]["max_new_tokens"] == 8
    # the file of each eval holds one record per problem: 5 held-out (eval.max_problems),
    # 3 ID (its own max_problems), 4 OOD (the whole file)
    saved = json.loads((probe_run / "eval" / "step_000002.json").read_text())
    sizes = {s: len(saved["records"][s]["greedy"]) for s in SETS}
    assert sizes == {"heldout": 5, "id_probe": 3, "ood_probe": 4}
    assert [r["prompt"] for r in saved["records"]["ood_probe"]["sampling"]] == [
        f"What is {a} * {a + 3}?" for a in range(10, 14)
    ]


def test_best_json_names_the_best_eval_in_metrics_jsonl(probe_run: Path) -> None:
    series = [
        (m["step"], m["eval/heldout/greedy_pass@1"])
        for m in read_metrics(probe_run)
        if "eval/heldout/greedy_pass@1" in m
    ]
    top = max(value for _, value in series)
    first_top = min(step for step, value in series if value == top)  # ties keep the earlier
    best = json.loads((probe_run / "best.json").read_text())
    assert best == {"metric": "eval/heldout/greedy_pass@1", "step": first_top, "value": top}


def test_offline_eval_of_the_run_matches_the_in_training_eval(
    probe_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "offline.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rlvr", "eval", str(probe_run), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    offline = json.loads(out.read_text())
    in_training = json.loads((probe_run / "eval" / "step_000002.json").read_text())
    assert offline["model"] == str(probe_run / "final")
    # identical per-problem records (responses, extracted answers, correctness, scores) for
    # every set and both modes, hence identical scores
    assert offline["records"] == in_training["records"]
    assert offline["results"] == in_training["results"]

    # ... and the comparison compares something: answers differ between problems, grades are
    # mixed, and each grade is the toy rule applied to that very response
    greedy = [r for s in SETS for r in offline["records"][s]["greedy"]]
    assert len({r["responses"][0] for r in greedy}) > 1
    grades = [
        (c, first_char_even(text))
        for s in SETS
        for mode in ("greedy", "sampling")
        for r in offline["records"][s][mode]
        for text, c in zip(r["responses"], r["correct"], strict=True)
    ]
    assert all(c == rule for c, rule in grades)
    assert {c for c, _ in grades} == {True, False}

    # measured the same way: no field of the provenance differs, so no warning
    assert offline["provenance"] == in_training["provenance"]
    assert "measured differently" not in proc.stderr

    # one row per set and metric, with the mode, k, temperature and top-p beside the number
    rows = {
        cells[0]: cells[1:]
        for line in proc.stdout.splitlines()
        if line.startswith("| ")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    for s in SETS:
        assert rows[f"{s} greedy_pass@1"][1:5] == ["greedy", "1", "0", "1"]
        for metric in METRICS[1:]:
            assert rows[f"{s} {metric}"][1:5] == ["sampling", "2", "0.6", "1"]


def test_a_checkpoint_evaluates_like_the_eval_at_its_step(
    probe_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", str(probe_run / "checkpoints" / "step_000001")]) == 0
    capsys.readouterr()
    offline = json.loads((probe_run / "eval" / "offline_step_000001.json").read_text())
    assert offline["model"] == str(probe_run / "checkpoints" / "step_000001" / "model")
    at_step_1 = json.loads((probe_run / "eval" / "step_000001.json").read_text())
    assert offline["records"] == at_step_1["records"]


def test_lora_run_evaluates_offline_from_its_run_directory_alone(
    sharp_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = load_config(
        None,
        tiny_overrides(
            sharp_model_dir,
            tmp_path / "runs",
            "train.max_steps=1",
            "train.run_name=lora",
            "train.lr=0.05",
            "model.lora.enabled=true",
            "model.lora.rank=4",
            "model.lora.target_modules=[q_proj, v_proj]",
        ),
    )
    run_dir = Path(Trainer(cfg).fit()["run_dir"])
    assert (run_dir / "final" / "adapter_config.json").exists()

    # Another machine: the run directory is copied and the base path recorded in the adapter
    # does not exist there; the run's config.yaml names the base model to use instead.
    moved = tmp_path / "elsewhere" / "lora"
    shutil.copytree(run_dir, moved)
    adapter_cfg = moved / "final" / "adapter_config.json"
    data = json.loads(adapter_cfg.read_text())
    data["base_model_name_or_path"] = str(tmp_path / "no-such-base")
    adapter_cfg.write_text(json.dumps(data))

    assert main(["eval", str(moved)]) == 0
    capsys.readouterr()
    offline = json.loads((moved / "eval" / "offline_final.json").read_text())
    in_training = json.loads((run_dir / "eval" / "step_000001.json").read_text())
    assert offline["base"] == str(sharp_model_dir)
    assert offline["records"] == in_training["records"]

    # the adapter folder itself, on a base named by --base, gives the same records
    explicit = tmp_path / "explicit.json"
    argv = ["eval", str(moved / "final"), "--base", str(sharp_model_dir), "--out", str(explicit)]
    assert main(argv) == 0
    assert json.loads(explicit.read_text())["records"] == in_training["records"]

    # the adapter was applied: the base model alone answers at least one problem differently
    base_out = tmp_path / "base.json"
    config = str(moved / "config.yaml")
    assert main(["eval", str(sharp_model_dir), "-c", config, "--out", str(base_out)]) == 0
    base = json.loads(base_out.read_text())
    responses = [r["responses"] for r in offline["records"]["heldout"]["greedy"]]
    base_responses = [r["responses"] for r in base["records"]["heldout"]["greedy"]]
    assert responses != base_responses


def test_a_run_directory_without_a_final_model_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "crashed"
    run.mkdir()
    (run / "config.yaml").write_text(load_config(None).to_yaml())
    (run / "status.json").write_text(json.dumps({"state": "failed"}))
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"run directory {run} has no final/ model (run state: failed)" in err

    empty = tmp_path / "not_a_model"
    empty.mkdir()
    assert main(["eval", str(empty), "--data", str(tmp_path / "x.jsonl")]) == 2
    assert "is not a model folder (no config.json)" in capsys.readouterr().err
