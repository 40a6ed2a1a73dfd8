"""Every recipe in recipes/ loads, validates, passes the dry run and trains one step.

The full-size run needs GPUs and the hub; here each recipe keeps its objective, its knobs, its
template (`chat` becomes `none`: the tiny tokenizer has no chat template), its field mapping and
its reward, while the model becomes the tiny random model and the data a hub-layout folder made
by the test in the recipe's own schema (fields, answer format).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlvr.config import config_from_dict, load_config
from rlvr.model.loading import DEFAULT_MODEL
from rlvr.training.preflight.checks import check_config, config_problems

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"
RECIPES = sorted(RECIPES_DIR.glob("*.yaml"))
HEADER_KEYS = ("recipe", "source", "gpus", "time")
# The one recipe whose data is a local folder (not on the hub): its dry run here names it.
LOCAL_DATA = {"drgrpo_math_qwen25math_1p5b.yaml": "oat/data/train/math_lvl3to5_8k?split=train"}


def header(path: Path) -> dict[str, str]:
    """The `# key: value` lines at the top of a recipe (continuation lines are appended)."""
    out: dict[str, str] = {}
    last = None
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        m = re.match(r"#\s*(\w+):\s*(.*)", line)
        if m and m.group(1) in HEADER_KEYS:
            last = m.group(1)
            out[last] = m.group(2)
        elif last and line.startswith("#    "):
            out[last] += " " + line.lstrip("# ")
        else:
            last = None
    return out


def test_there_is_a_recipe_per_published_setup() -> None:
    names = [p.name for p in RECIPES]
    assert names == [
        "calc_agent.yaml",
        "calc_tool.yaml",
        "code_fn.yaml",
        "dapo.yaml",
        "drgrpo_math_qwen25math_1p5b.yaml",
        "grpo_countdown_qwen25_3b.yaml",
        "gspo.yaml",
        "lora_grpo_harmony_gptoss_20b.yaml",
        "maxent_listwise_math_qwen25math_1p5b.yaml",
        "ppo_gsm8k_rho1b.yaml",
        "psgrpo_prm_math.yaml",
    ]
    table = (RECIPES_DIR / "README.md").read_text()
    for name in names:
        assert f"`{name}`" in table, f"recipes/README.md has no row for {name}"


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_cites_its_source_and_cost(path: Path) -> None:
    h = header(path)
    assert set(h) == set(HEADER_KEYS), f"{path.name}: header has {sorted(h)}"
    assert re.search(r"arXiv \d{4}\.\d{5}|repository [\w.-]+/[\w.-]+", h["source"]), h["source"]
    assert re.search(r"\d", h["gpus"]), h["gpus"]  # a GPU count


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_validates(path: Path) -> None:
    cfg = load_config(path)
    expected = []
    if path.name in LOCAL_DATA:
        expected = [
            f"data.train_path: {LOCAL_DATA[path.name]}: no such file or folder "
            f"(a hub dataset is written hf:owner/name?split=...); relative to {Path.cwd()}"
        ]
    assert config_problems(cfg) == expected
    for s in cfg.eval.sets:  # every eval set has rows: a data path or a named benchmark's
        assert s.resolved().path is not None, s.name


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_dry_run_of_the_recipe_as_written_offline(
    path: Path, tmp_path: Path, offline: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Offline, a hub recipe still passes: what it could not check is listed."""
    from rlvr.cli.main import main

    code = main(["train", "--dry-run", "-c", str(path), f"train.output_dir={tmp_path}"])
    captured = capsys.readouterr()
    if path.name in LOCAL_DATA:
        assert code == 2
        problem = (
            f"config problem: data.train_path: {LOCAL_DATA[path.name]}: no such file or folder"
        )
        assert problem in captured.out
        assert captured.out.rstrip().endswith("dry run FAILED")
        return
    assert code == 0, captured.out + captured.err
    out = captured.out
    assert out.rstrip().endswith("dry run OK: nothing was trained")
    cfg = load_config(path)
    if cfg.model.name_or_path != DEFAULT_MODEL:  # the default is a local folder once converted
        assert "not checked: tokenizer of model.name_or_path=" in out
    if cfg.data.task == "file":
        assert "not checked: data not read: hub dataset" in out


def tiny_rows(cfg_data: dict[str, Any], n: int) -> list[dict]:
    """Rows in the recipe's schema: its prompt/answer fields, its answer format."""
    prompt_field = cfg_data.get("prompt_field", "prompt")
    answer_field = cfg_data.get("answer_field", "answer")
    extract = cfg_data.get("answer_extract", "none")
    rows = []
    for i in range(n):
        answer = {"boxed": f"so \\boxed{{{i}}}.", "gsm8k": f"{i} + 0 = {i}\n#### {i}"}.get(
            extract, str(i)
        )
        rows.append({prompt_field: f"what is {i} plus 7?", answer_field: answer})
    return rows


def swap_to_tiny(path: Path, model_dir: Path, tmp_path: Path) -> dict[str, Any]:
    """The recipe as a dict with the model, the data and the scale swapped for tiny ones."""
    data = yaml.safe_load(path.read_text())
    d, r, a, t = data["data"], data["rollout"], data["algo"], data["train"]
    data["model"]["name_or_path"] = str(model_dir)
    if d["task"] == "file":
        folder = tmp_path / "data"
        (folder).mkdir()
        (folder / "README.md").write_text("# tiny rows in the recipe's schema\n")
        rows = tiny_rows(d, 16)
        (folder / "train.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
        d["train_path"] = f"{folder}?split=train"
        d.pop("eval_path", None)
    else:
        d["num_train"], d["num_eval"] = 16, 4
    if d.get("template", "chat") == "chat":
        d["template"] = "none"
    d["max_prompt_tokens"] = 1000
    r.update(engine="hf", max_new_tokens=8, sleep_during_update=False)
    if "max_episode_tokens" in r:  # episodes: two turns of 8 and an environment turn
        r["max_episode_tokens"] = 24
    if data["reward"].get("overlong_buffer"):  # the buffer must fit in the 8-token budget
        data["reward"]["overlong_buffer"] = 4
    a["prompts_per_step"] = a.get("minibatches", 1)  # the smallest batch of whole minibatches
    env = data.get("env", {})
    if str(env.get("name", "")).startswith("agent:") and "few_shot" in env.get("kwargs", {}):
        # an agent's tools block alone is ~620 characters of the 1024 positions: no examples
        env["kwargs"]["few_shot"] = 0
    for spec in data["reward"]["specs"]:
        if "prm" in spec.get("kwargs", {}):
            spec["kwargs"].update(prm="toy_rewards:toy_prm", device="cpu", min_steps=0)
            spec["kwargs"]["step_pattern"] = "[a-z]"
    t.update(max_steps=1, warmup_steps=0, output_dir=str(tmp_path / "runs"), save_every=0)
    data["eval"] = {"before_after": False, "every": 0}
    data["logging"] = {"progress": False, "samples_every": 0}
    return data


@pytest.fixture(scope="module")
def tiny_long_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with 1024 positions (character tokens): the r1 template alone is ~500 characters."""
    from rlvr.training.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny1024") / "model", max_positions=1024)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_trains_one_step_on_tiny_model_and_data(
    path: Path, tiny_long_model_dir: Path, tmp_path: Path
) -> None:
    from rlvr.training.preflight.dry_run import make_plan
    from rlvr.training.trainer import Trainer

    recipe = load_config(path)
    cfg = check_config(config_from_dict(swap_to_tiny(path, tiny_long_model_dir, tmp_path)))
    # the recipe's knobs survive the swap
    assert cfg.algo.objective == recipe.algo.objective
    assert cfg.algo.group_size == recipe.algo.group_size
    assert cfg.model.lora == recipe.model.lora
    assert cfg.reward.specs[0].name == recipe.reward.specs[0].name

    plan = make_plan(cfg)
    assert plan.ok, (plan.problems, plan.schedule_text)
    assert plan.train_rows == 16
    assert plan.sequences_per_step == cfg.algo.prompts_per_step * recipe.algo.group_size

    summary = Trainer(cfg).fit()
    run_dir = Path(summary["run_dir"])
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "reward_mean" in m]
    assert [m["step"] for m in steps] == [1]
    m = steps[0]
    for key in ("reward_mean", "policy_loss", "grad_norm", "lr"):
        assert math.isfinite(m[key]), (key, m[key])
    assert m["lr"] == pytest.approx(recipe.train.lr, rel=0.5)
    assert m["optimizer_steps"] == recipe.algo.minibatches * recipe.algo.epochs_per_batch
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"
