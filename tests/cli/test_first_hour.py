"""A user's first hour, as real `rlvr` processes on the tiny model: their own JSONL file (no
data.task), their own reward that raises on some rows, LoRA, replies cut at the token limit, a
run shorter than the health warm-up and the samples interval, a resume, a merge and an eval of
the merged folder. Each of these used to exit 0 while doing something else or saying nothing:
the file was ignored for the built-in task, the reward's exception was kept nowhere, the cut
replies went unmentioned, the LoRA adapters barely moved at the full fine-tuning rate, no
samples were written, files were owner-only, the resumed bar counted from 0, and the merged
model was evaluated without the run's fields and token limit.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REWARD = '''
def strict(prompt, response, reference, level, **row):
    """Row fields arrive as keyword arguments: `level` is a column of the JSONL file."""
    if level == "hard":
        raise ValueError(f"no grader for hard rows yet (answer {reference})")
    return float(reference in response)
'''
TRAIN = [  # 8 rows, 2 hard: every 2 steps of 4 prompts draw each row once
    ("FILEROW-1 what is 2 + 3?", "5", "easy"),
    ("FILEROW-2 what is 4 + 4?", "8", "easy"),
    ("FILEROW-3 what is 1 + 6?", "7", "hard"),
    ("FILEROW-4 what is 9 - 2?", "7", "easy"),
    ("FILEROW-5 what is 3 * 3?", "9", "easy"),
    ("FILEROW-6 what is 8 - 5?", "3", "hard"),
    ("FILEROW-7 what is 2 * 4?", "8", "easy"),
    ("FILEROW-8 what is 7 + 0?", "7", "easy"),
]
HELDOUT = [
    ("HELDOUT-1 what is 1 + 1?", "2", "easy"),
    ("HELDOUT-2 what is 5 - 1?", "4", "hard"),
    ("HELDOUT-3 what is 3 + 3?", "6", "easy"),
]
MAX_NEW_TOKENS = 12  # the tiny model's replies run to the limit: all of them are cut


def _write(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    path.write_text(
        "".join(json.dumps({"question": q, "answer": a, "level": lv}) + "\n" for q, a, lv in rows)
    )
    return path


def rlvr(cwd: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m rlvr ARGS`` in ``cwd`` under umask 022 (the usual one)."""
    return subprocess.run(
        [sys.executable, "-m", "rlvr", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=lambda: os.umask(0o022),
    )


@pytest.fixture(scope="module")
def user(tmp_path_factory, tiny_model_dir) -> dict:
    """One 3-step LoRA run on the user's files, as the user types it: no data.task, no lr."""
    home = tmp_path_factory.mktemp("user")
    (home / "my_reward.py").write_text(REWARD)
    _write(home / "train.jsonl", TRAIN)
    _write(home / "heldout.jsonl", HELDOUT)
    proc = rlvr(
        home,
        "train",
        f"model.name_or_path={tiny_model_dir}",
        "data.train_path=train.jsonl",
        "data.eval_path=heldout.jsonl",
        "data.prompt_field=question",
        "data.template=none",
        "reward.specs=[{name: 'my_reward:strict'}]",
        "model.lora.enabled=true",
        "model.lora.rank=4",
        f"rollout.max_new_tokens={MAX_NEW_TOKENS}",
        "algo.group_size=2",
        "algo.prompts_per_step=4",
        "train.max_steps=3",
        "train.save_every=3",
        "train.threads=1",
        "train.output_dir=runs",
        "train.run_name=mine",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"home": home, "run": home / "runs" / "mine", "out": proc.stdout, "err": proc.stderr}


def samples(run: Path) -> dict[int, list[dict]]:
    return {
        int(p.stem.split("_")[1]): [json.loads(line) for line in p.read_text().splitlines()]
        for p in sorted((run / "samples").glob("step_*.jsonl"))
    }


def test_a_data_file_without_data_task_is_used_and_said(user: dict) -> None:
    assert "[rlvr] inferred: data.task=file (inferred from data.train_path" in user["out"]
    assert "[rlvr] reward: my_reward:strict\n" in user["out"]
    assert (
        "[rlvr] data: 8 train rows from train.jsonl, 3 held-out rows from heldout.jsonl"
        in (user["out"])
    )
    prompts = {s["prompt"] for step in samples(user["run"]).values() for s in step}
    assert prompts and all(p.startswith("FILEROW-") for p in prompts), prompts
    evals = json.loads((user["run"] / "eval" / "step_000000.json").read_text())
    assert [r["prompt"] for r in evals["records"]["heldout"]["greedy"]] == [
        q for q, _, _ in HELDOUT
    ]


def test_a_raising_reward_is_told_once_with_its_traceback_and_kept_per_sample(user: dict) -> None:
    err = user["err"]
    assert err.count("[rlvr] warning: reward 'my_reward:strict'") == 1, err
    assert "ValueError: no grader for hard rows yet" in err
    assert 'File "' in err and "my_reward.py" in err  # the user's own frame of the traceback
    assert '"level": "hard"' in err  # the row it failed on
    assert "reward_failed=" in err  # the progress bar
    steps = samples(user["run"])
    for step in steps.values():
        for s in step:
            hard = s["prompt"] in {q for q, _, lv in TRAIN if lv == "hard"}
            assert s["valid"] is not hard
            assert (s["reward_error"] is not None) is hard
            if hard:
                assert "ValueError: no grader for hard rows yet" in s["reward_error"]
    metrics = [json.loads(x) for x in (user["run"] / "metrics.jsonl").read_text().splitlines()]
    assert sum(m.get("reward_failures", 0) for m in metrics) > 0
    evals = json.loads((user["run"] / "eval" / "step_000000.json").read_text())
    errors = [r["reward_errors"][0] for r in evals["records"]["heldout"]["greedy"]]
    assert [e is not None for e in errors] == [lv == "hard" for _, _, lv in HELDOUT]
    assert evals["results"]["heldout"]["greedy/reward_failed_frac"] == pytest.approx(1 / 3)


def test_cut_replies_are_said_before_training_and_at_the_first_step(user: dict) -> None:
    err = user["err"]
    assert (
        f"100% of the replies of the evaluation before training (heldout/greedy) hit the token "
        f"limit, rollout.max_new_tokens={MAX_NEW_TOKENS}" in err
    )
    assert "[rlvr] health warn: truncation at step 1:" in err  # health.warmup_steps is 5
    assert "Raise rollout.max_new_tokens" in err


def test_lora_without_a_learning_rate_gets_the_lora_rate_and_says_it(user: dict) -> None:
    assert "[rlvr] inferred: train.lr=0.0002 (LoRA default" in user["out"]
    lrs = [
        json.loads(x).get("lr") for x in (user["run"] / "metrics.jsonl").read_text().splitlines()
    ]
    assert [lr for lr in lrs if lr is not None] == [2e-4, 2e-4, 2e-4]
    assert "FutureWarning" not in user["err"]


def test_a_short_run_keeps_samples_and_readable_files(user: dict) -> None:
    assert sorted(samples(user["run"])) == [1, 3]  # logging.samples_every=5: first and last
    for path in user["run"].rglob("*"):
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) & 0o044 == 0o044, path  # group/other read


def test_a_resumed_run_counts_its_steps_on(user: dict, tmp_path: Path) -> None:
    copy = tmp_path / "mine"
    shutil.copytree(user["run"], copy)
    proc = rlvr(user["home"], "train", "--resume", str(copy), "train.max_steps=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    bars = re.findall(r"train:\s+\d+%\|[^|]*\|\s*(\d+)/(\d+)", proc.stderr)
    assert bars[0] == ("3", "4") and bars[-1] == ("4", "4"), bars


def test_a_merged_run_is_evaluated_with_the_runs_settings(user: dict, tmp_path: Path) -> None:
    merged = tmp_path / "merged"
    proc = rlvr(user["home"], "merge", str(user["run"]), "--out", str(merged))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((merged / "rlvr_run.json").read_text())["run"] == str(user["run"].resolve())
    # copied away from its run: the folder's own copy of the run's config still applies
    away = tmp_path / "away"
    shutil.copytree(merged, away)
    (away / "rlvr_run.json").write_text(json.dumps({"run": str(tmp_path / "gone")}))
    for folder in (merged, away):
        proc = rlvr(user["home"], "eval", str(folder), "--data", "heldout.jsonl", "--out", "e.json")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"max new tokens {MAX_NEW_TOKENS}" in proc.stdout
        records = json.loads((user["home"] / "e.json").read_text())["records"]["heldout"]["greedy"]
        assert [r["prompt"] for r in records] == [q for q, _, _ in HELDOUT]


def test_a_missing_prompt_field_names_the_knob(user: dict, tmp_path: Path) -> None:
    proc = rlvr(
        user["home"],
        "eval",
        str(user["run"] / "final"),
        "--data",
        "heldout.jsonl",
        "-c",
        str(_empty_config(tmp_path)),
    )
    assert proc.returncode == 2
    assert "no prompt field 'prompt'" in proc.stderr
    assert "data.prompt_field=question" in proc.stderr


def _empty_config(tmp_path: Path) -> Path:
    path = tmp_path / "bare.yaml"
    path.write_text("data: {template: none}\n")
    return path
