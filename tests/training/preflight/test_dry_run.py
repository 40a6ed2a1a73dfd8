"""`rlvr train --dry-run`: the plan is printed and checked, and no model weights are loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def no_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to load model weights fails the test."""
    import transformers

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("--dry-run loaded model weights")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


def _write_rows(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p, "answer": "1"}) + "\n" for p in prompts))
    return path


def _dry(tiny_model_dir: Path, tmp_path: Path, *overrides: str) -> list[str]:
    return [
        "train",
        "--dry-run",
        f"model.name_or_path={tiny_model_dir}",
        f"train.output_dir={tmp_path / 'runs'}",
        "data.template=none",
        "rollout.max_new_tokens=8",
        *overrides,
    ]


def test_dry_run_prints_the_plan_from_a_file(
    tiny_model_dir: Path, tmp_path: Path, no_weights: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlvr.cli.main import main

    train = _write_rows(tmp_path / "train.jsonl", ["abcdefg", "xy", "what is 1?"] * 4)  # 12 rows
    evals = _write_rows(tmp_path / "eval.jsonl", ["q1", "q2", "q3"])
    argv = _dry(
        tiny_model_dir,
        tmp_path,
        "data.task=file",
        f"data.train_path={train}",
        f"data.eval_path={evals}",
        "data.max_prompt_tokens=32",
        "algo.prompts_per_step=3",
        "algo.group_size=4",
        "train.max_steps=10",
        "train.schedule=cosine",
        "train.warmup_steps=2",
        "train.lr=1e-5",
    )
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "train rows: 12; eval rows: 3" in out
    assert "example prompt (7 tokens):\n  | abcdefg" in out  # the char tokenizer: one per char
    assert "longest prompt: 10 tokens (data.max_prompt_tokens=32)" in out
    assert "steps: 10 (= 2.50 epochs over the train rows)" in out  # 10 * 3 / 12
    assert "samples/step: 12" in out
    assert "tokens/step <= 480 (= 12 x (32 prompt + 8 new))" in out
    assert "learning-rate schedule (cosine, warmup 2, peak 1e-05):" in out
    assert "       0   5.000e-06    50.0%" in out  # warm-up step 0 = 1/2 of peak
    assert out.rstrip().endswith("dry run OK: nothing was trained")
    assert not (tmp_path / "runs").exists()


def test_dry_run_fails_on_a_prompt_longer_than_the_limit(
    tiny_model_dir: Path, tmp_path: Path, no_weights: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlvr.cli.main import main

    train = _write_rows(tmp_path / "train.jsonl", ["short", "a much longer prompt"] * 4)
    argv = _dry(
        tiny_model_dir,
        tmp_path,
        "data.task=file",
        f"data.train_path={train}",
        "data.max_prompt_tokens=10",
    )
    assert main(argv) == 2
    out = capsys.readouterr().out
    assert (
        "config problem: data.max_prompt_tokens=10: the longest of the first 8 train prompts "
        "has 20 tokens"
    ) in out
    assert out.rstrip().endswith("dry run FAILED")


def test_dry_run_fails_on_a_warmup_longer_than_the_run(
    tiny_model_dir: Path, tmp_path: Path, no_weights: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlvr.cli.main import main

    argv = _dry(tiny_model_dir, tmp_path, "train.max_steps=20", "train.warmup_steps=200")
    assert main(argv) == 2
    out = capsys.readouterr().out
    assert "train rows: 2000; eval rows: 100" in out  # the built-in arithmetic task's defaults
    assert "FAIL: by step 19" in out


def test_dry_run_says_what_it_could_not_check_without_a_tokenizer(
    tmp_path: Path, no_weights: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlvr.cli.main import main

    empty = tmp_path / "not_a_model"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    argv = _dry(empty, tmp_path, "train.max_steps=5")
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"not checked: tokenizer of model.name_or_path='{empty}' could not be loaded" in out
    assert "example prompt (not counted):" in out


def test_eval_accepts_overrides_after_its_options() -> None:
    from rlvr.cli.main import build_parser, parse_args_any_order

    argv = ["eval", "MODEL", "--data", "F.jsonl", "data.template=none", "--k", "4", "a.b=2"]
    args = parse_args_any_order(build_parser(), argv)
    assert (args.model, args.data, args.k) == ("MODEL", "F.jsonl", 4)
    assert args.overrides == ["data.template=none", "a.b=2"]


def test_dry_run_counts_image_tokens_of_the_visual_task(
    tiny_vlm_dir: Path,
    tiny_model_dir: Path,
    tmp_path: Path,
    no_weights: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tiny VLM's processor turns each 84x84 scene into 4 image tokens between the two
    vision markers: 6 tokens more than the same chat text alone, which a text model cannot take."""
    import transformers

    from rlvr.cli.main import main

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("--dry-run loaded VLM weights")

    monkeypatch.setattr(transformers.AutoModelForImageTextToText, "from_pretrained", refuse)
    shapes = ("data.task=shapes", "data.template=chat", "data.num_train=8", "data.num_eval=2")
    assert main(_dry(tiny_vlm_dir, tmp_path, *shapes)) == 0
    out = capsys.readouterr().out
    assert "<|vision_start|><|image_pad|><|vision_end|>How many" in out
    with_image = int(out.split("example prompt (")[1].split(" tokens")[0])
    assert main(_dry(tiny_model_dir, tmp_path, *shapes)) == 2
    out = capsys.readouterr().out
    assert "config problem: data.task=shapes: rows carry images but the model has no image" in out
    text_only = int(out.split("example prompt (")[1].split(" tokens")[0])
    assert with_image - text_only == 6


def test_a_dry_run_with_no_route_to_the_hub_goes_offline_at_once(tmp_path: Path) -> None:
    """A compute node without internet: the hub endpoint refuses connections (a closed port on
    127.0.0.1). The run probes it once, says it works offline, and no hub call waits out its
    retries ("Retrying in 1s ... 8s", over a minute in all before). Data that could not be read
    gives no epoch count (it printed "= 64000.00 epochs" over 0 rows)."""
    import os
    import subprocess
    import sys

    from rlvr.rollout.server_launch import free_port

    endpoint = f"http://127.0.0.1:{free_port('127.0.0.1')}"  # nothing listens there
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
    env.pop("RLVR_HUB_PROBED", None)
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"))  # an empty cache
    argv = [
        "train",
        "--dry-run",
        "model.name_or_path=someone/not-cached-model",
        "data.task=file",
        "data.train_path=hf:someone/not-cached-data?split=train",
        "train.max_steps=500",
    ]
    res = subprocess.run(
        [sys.executable, "-m", "rlvr", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )

    out = res.stdout + res.stderr
    assert f"[rlvr] the Hugging Face hub ({endpoint}) is not reachable" in out, out[-3000:]
    assert "offline for this run (HF_HUB_OFFLINE=1)" in out
    assert "Retrying in" not in out, out[-3000:]  # no call waited for the network
    assert "not checked: data not read" in out
    assert "steps: 500 (epochs not known: the train rows were not read)" in out
    assert "epochs over the train rows" not in out


def test_dry_run_fails_where_the_run_would_refuse_its_directory(
    tiny_model_dir: Path, tmp_path: Path, no_weights: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Running the README's commands a second time: the dry run said OK, then `rlvr train`
    refused at once ('run directory ... already holds a run')."""
    from rlvr.cli.main import main

    old = tmp_path / "runs" / "mine"
    old.mkdir(parents=True)
    (old / "metrics.jsonl").write_text('{"step": 1}\n')
    assert main(_dry(tiny_model_dir, tmp_path, "train.run_name=mine")) == 2
    out = capsys.readouterr().out
    assert f"config problem: run directory {old} already holds a run" in out
    assert main([*_dry(tiny_model_dir, tmp_path, "train.run_name=other")]) == 0


def test_a_held_out_file_alone_says_what_to_do_and_nothing_else(
    tiny_model_dir: Path, tmp_path: Path, no_weights: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """data.eval_path alone (train on the built-in task, grade on my file?) got 'data.task=file
    needs data.train_path' and a second problem 'data not read: None: no such file'."""
    from rlvr.cli.main import main

    held = _write_rows(tmp_path / "heldout.jsonl", ["1+1"])
    assert main(_dry(tiny_model_dir, tmp_path, f"data.eval_path={held}")) == 2
    out = capsys.readouterr().out
    assert "None" not in out.partition("config problem")[2], out
    assert "data.task=file needs data.train_path" in out
    assert "eval.sets=[{name: heldout, path: " in out  # the built-in task, graded on the file


def test_the_dry_run_names_the_reward_a_data_file_is_graded_with(
    tiny_model_dir: Path, tmp_path: Path, no_weights: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A data file without reward.specs is graded by the maths grader: nothing said so."""
    from rlvr.cli.main import main

    rows = _write_rows(tmp_path / "train.jsonl", ["1+1"])
    assert main(_dry(tiny_model_dir, tmp_path, f"data.train_path={rows}")) == 0
    out = capsys.readouterr().out
    assert "reward: math (data.task=file's grader: reward.specs is empty;" in out
    both = "reward.specs=[{name: math}, {name: countdown, weight: 0.5}]"
    assert main(_dry(tiny_model_dir, tmp_path, f"data.train_path={rows}", both)) == 0
    assert "reward: math + 0.5 x countdown\n" in capsys.readouterr().out


def test_the_dry_run_says_an_agent_scores_its_own_episodes(
    tiny_model_dir: Path, tmp_path: Path, no_weights: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """With env.name=agent:..., the episode's reward is what the agent returns (the reward specs
    are only logged beside) and the agent writes its own requests from the row: the dry run
    said "reward: math (data.task=file's grader ...)" and showed the template's rendering as the
    prompt the run sends."""
    pytest.importorskip("openai")
    from rlvr.cli.main import main

    rows = _write_rows(tmp_path / "train.jsonl", ["What is 2+2?"])
    argv = _dry(
        tiny_model_dir,
        tmp_path,
        f"data.train_path={rows}",
        "env.name=agent:user_agents:three_turn_agent",
        "rollout.max_turns=3",
    )
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert (
        "reward: the agent's own (env.name=agent:user_agents:three_turn_agent returns it); "
        "logged beside, not scored: math\n" in out
    ), out
    assert (
        "example prompt (12 tokens; data.template's rendering of the row, which the agent "
        "receives whole with its fields answer, prompt: it writes its own requests):\n"
        "  | What is 2+2?\n" in out
    ), out
    # a plain run keeps the plain label
    assert main(_dry(tiny_model_dir, tmp_path, f"data.train_path={rows}")) == 0
    assert "example prompt (12 tokens):\n" in capsys.readouterr().out
