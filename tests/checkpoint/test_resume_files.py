"""Resume bookkeeping without training: which run and checkpoint `train.resume` picks, the checks
on a changed config, and how a run's files are rewound to the checkpoint step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlvr.checkpoint.full import checkpoints_dir, write_checkpoint
from rlvr.checkpoint.resume_plan import plan_resume
from rlvr.cli.main import main as cli_main
from rlvr.config import ConfigError, load_config
from rlvr.training.loop import rewind_run_files
from rlvr.training.setup import make_run_dir


class StubModel:
    def save_pretrained(self, folder: Path) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "weights.bin").write_bytes(b"w")


def fake_run(out: Path, name: str, steps: list[int], *overrides: str) -> Path:
    """A run directory with a metrics file and complete checkpoints at ``steps``."""
    cfg = load_config(None, [f"train.output_dir={out}", f"train.run_name={name}", *overrides])
    run_dir = make_run_dir(cfg, None)
    (run_dir / "metrics.jsonl").write_text("".join(f'{{"step": {s}}}\n' for s in range(5)))
    for s in steps:
        write_checkpoint(
            run_dir,
            s,
            model=StubModel(),
            tokenizer=None,
            tensors={"t": torch.zeros(1)},
            plain={},
            config_yaml=cfg.to_yaml(),
        )
    return run_dir


def test_resume_path_picks_the_newest_complete_checkpoint(tmp_path):
    run_dir = fake_run(tmp_path, "r", [2, 4])
    (checkpoints_dir(run_dir) / "step_000006").mkdir()  # torn: no COMPLETE
    cfg = load_config(run_dir / "config.yaml", [f"train.resume={run_dir}"])
    plan = plan_resume(cfg)
    assert (plan.run_dir, plan.step) == (run_dir, 4)
    assert plan.checkpoint == checkpoints_dir(run_dir) / "step_000004"


def test_resume_auto_continues_by_run_name_or_starts_fresh(tmp_path):
    fake_run(tmp_path, "r", [2])
    same = [f"train.output_dir={tmp_path}", "train.run_name=r", "train.resume=auto"]
    assert plan_resume(load_config(None, same)).step == 2
    # a name with no run behind it: a fresh run
    other = [f"train.output_dir={tmp_path}", "train.run_name=new", "train.resume=auto"]
    assert plan_resume(load_config(None, other)) is None
    # a run killed before its first checkpoint: started over in the same directory
    bare = fake_run(tmp_path, "bare", [])
    plan = plan_resume(load_config(None, [*other[:1], "train.run_name=bare", "train.resume=auto"]))
    assert (plan.run_dir, plan.checkpoint, plan.step) == (bare, None, 0)
    with pytest.raises(ConfigError, match="train.resume=auto needs train.run_name"):
        plan_resume(load_config(None, ["train.resume=auto"]))


def test_resume_errors_name_the_problem(tmp_path):
    bare = fake_run(tmp_path, "bare", [])
    (checkpoints_dir(bare)).mkdir()
    (checkpoints_dir(bare) / ".tmp-step_000002").mkdir()
    with pytest.raises(ConfigError, match=r"no complete checkpoint.*\.tmp-step_000002"):
        plan_resume(load_config(None, [f"train.resume={bare}"]))
    with pytest.raises(ConfigError, match="no such run directory"):
        plan_resume(load_config(None, [f"train.resume={tmp_path / 'nope'}"]))
    run_dir = fake_run(tmp_path, "lora", [2], "model.lora.enabled=true", "model.lora.rank=8")
    changed = [f"train.resume={run_dir}", "model.lora.enabled=true", "model.lora.rank=4"]
    with pytest.raises(ConfigError, match=r"model\.lora: checkpoint .*'rank': 8.*'rank': 4"):
        plan_resume(load_config(None, changed))
    # starting a new run over an existing one points at --resume
    with pytest.raises(ConfigError, match="--resume"):
        make_run_dir(
            load_config(None, [f"train.output_dir={tmp_path}", "train.run_name=lora"]), None
        )


def test_cli_resume_refuses_a_missing_directory(tmp_path, capsys):
    assert cli_main(["train", "--resume", str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err


def write_lines(path: Path, steps: list[int]) -> None:
    path.write_text("".join(json.dumps({"step": s, "v": s * 10}) + "\n" for s in steps))


def steps_in(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_rewind_forgets_everything_after_the_checkpoint_step(tmp_path):
    run = tmp_path
    # metrics 0..5 with a torn last line from the kill
    write_lines(run / "metrics.jsonl", [0, 1, 2, 3, 4, 5])
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "rew')
    write_lines(run / "spikes.jsonl", [1, 4])
    write_lines(run / "health_events.jsonl", [3, 5])
    for s in (2, 4):
        (run / "samples").mkdir(exist_ok=True)
        (run / "samples" / f"step_{s:06d}.jsonl").write_text("{}\n")
    for s in (0, 3, 4):
        (run / "eval").mkdir(exist_ok=True)
        (run / "eval" / f"step_{s:06d}.json").write_text("{}")
    for name in ("summary.json", "early_stop.json", "health.json"):
        (run / name).write_text("{}")

    rewind_run_files(run, 3)

    assert steps_in(run / "metrics.jsonl") == [0, 1, 2, 3]
    assert steps_in(run / "spikes.jsonl") == [1]
    assert steps_in(run / "health_events.jsonl") == [3]
    assert sorted(p.name for p in (run / "samples").iterdir()) == ["step_000002.jsonl"]
    assert sorted(p.name for p in (run / "eval").iterdir()) == [
        "step_000000.json",
        "step_000003.json",
    ]
    assert not any((run / n).exists() for n in ("summary.json", "early_stop.json", "health.json"))

    rewind_run_files(run, -1)  # a run started over: nothing of the old one remains
    assert (run / "metrics.jsonl").read_text() == ""
    assert list((run / "eval").iterdir()) == []
