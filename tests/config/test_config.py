"""Config: unknown keys suggest the right one, overrides parse, guardrails name the knob and rule."""

import ast
import subprocess
import sys

import pytest
import yaml

from rlvr.config import ConfigError, load_config
from rlvr.objectives import build_objective
from rlvr.training.preflight.checks import check_config, config_problems


def test_defaults_are_the_demo():
    cfg = load_config()
    assert cfg.algo.objective == "drgrpo"
    assert build_objective(cfg).agg_mode == "seq_mean_token_sum_norm"
    assert cfg.model.name_or_path == "smollm2-135m-instruct"
    assert config_problems(cfg) == []


def test_dotted_overrides_parse_types(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algo:\n  group_size: 16\ntrain:\n  lr: 1.0e-5\n")
    cfg = load_config(
        path, ["algo.group_size=4", "train.lr=2e-6", "rollout.stop=[a, b]", "algo.dual_clip=3"]
    )
    assert cfg.algo.group_size == 4
    assert cfg.train.lr == 2e-6  # YAML 1.1 alone would read "2e-6" as a string
    assert cfg.rollout.stop == ["a", "b"]
    assert cfg.algo.dual_clip == 3.0


@pytest.mark.parametrize(
    "override, suggestion",
    [
        ("algo.group_sise=4", "algo.group_size"),
        ("train.learning_rate=1", "train.lr"),
        ("rollout.temprature=0.5", "rollout.temperature"),
        ("algo.maxent.tua=1", "algo.maxent.tau"),
    ],
)
def test_unknown_key_suggests_closest(override, suggestion):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert override.split("=")[0] in str(err.value)
    assert suggestion in str(err.value)


def test_bad_value_names_field_and_value():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.temperature=-1"])
    assert "rollout.temperature" in str(err.value) and "-1" in str(err.value)


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["algo.group_size=1"], "algo.group_size=1: must be > 1"),
        (["algo.objective=drgrpoo"], "did you mean 'drgrpo'"),
        (["algo.minibatches=3"], "algo.minibatches=3 must divide algo.prompts_per_step=4"),
        (
            ["algo.objective=maxent_listwise", "algo.micro_batch_size=4"],
            "must be divisible by algo.group_size=8",
        ),
        (
            ["algo.objective=maxent_listwise", "algo.maxent.tau=0"],
            "algo.maxent.tau=0.0: must be > 0",
        ),
        (["algo.objective=maxent_listwise", "algo.maxent.q_eps=0.2"], "algo.maxent.q_eps=0.2"),
        (
            ["algo.objective=maxent_listwise", "algo.loss_agg=token_mean"],
            "requires the Dr.GRPO critic",
        ),
        (["algo.dual_clip=0.5"], "algo.dual_clip=0.5"),
        (["data.task=file"], "data.task=file needs data.train_path"),
        (
            ["data.task=file", "data.train_path=/nonexistent/x.jsonl"],
            "data.train_path: /nonexistent/x.jsonl: no such file or folder",
        ),
        (["algo.loss_agg=mean"], "algo.loss_agg='mean' is unknown"),
        (  # an explicit other task with a path is a contradiction: both knobs named
            ["data.task=arithmetic", "data.train_path=x.jsonl"],
            "data.task=arithmetic generates its own rows, so data.train_path would be ignored: "
            "drop data.task (a data path alone means data.task=file) or drop data.train_path",
        ),
        (["data.task=countdown", "data.eval_path=x.jsonl"], "so data.eval_path would be ignored"),
    ],
)
def test_guardrails_name_knob_and_rule(overrides, needle):
    cfg = load_config(None, overrides)
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    assert needle in str(err.value)


def test_context_length_check():
    cfg = load_config(None, ["data.max_prompt_tokens=500", "rollout.max_new_tokens=100"])
    assert (
        cfg.validate_against_model(512)
        and "600 exceeds the model context (512" in cfg.validate_against_model(512)[0]
    )
    assert cfg.validate_against_model(4096) == []


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(None, ["algo.group_size=4"])
    path = tmp_path / "c.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(path) == cfg


def test_importing_the_config_loads_no_runtime_module() -> None:
    """Config is a leaf: a fresh interpreter that imports it and builds a Config has loaded no
    other rlvr module, and neither torch nor transformers (it used to load 31 rlvr modules,
    the reward sandbox pool among them)."""
    code = (
        "import sys, rlvr.config\n"
        "rlvr.config.load_config(None, ['algo.objective=ppo'])\n"
        "print(sorted(m for m in sys.modules if m.startswith(('rlvr', 'torch', 'transformers'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = ast.literal_eval(out.stdout)
    assert loaded and all(m == "rlvr" or m.startswith("rlvr.config") for m in loaded), loaded


@pytest.mark.parametrize(
    "overrides, task, inferred",
    [
        (["data.train_path=t.jsonl"], "file", {"data.task"}),
        (["data.eval_path=e.jsonl", "data.train_path=t.jsonl"], "file", {"data.task"}),
        (["data.task=file", "data.train_path=t.jsonl"], "file", set()),
        ([], "arithmetic", set()),
    ],
)
def test_a_data_path_alone_means_the_file_task(overrides, task, inferred):
    cfg = load_config(None, overrides)
    assert cfg.data.task == task
    assert set(cfg.inferred()) == inferred
    assert yaml.safe_load(cfg.to_yaml())["data"]["task"] == task  # a resume reads it as given


@pytest.mark.parametrize(
    "overrides, lr, inferred",
    [
        (["model.lora.enabled=true"], 2e-4, True),
        (["model.lora.enabled=true", "train.lr=5e-5"], 5e-5, False),
        ([], 2e-5, False),
    ],
)
def test_lora_without_a_learning_rate_gets_ten_times_the_full_rate(overrides, lr, inferred):
    cfg = load_config(None, overrides)
    assert cfg.train.lr == pytest.approx(lr)
    assert ("train.lr" in cfg.inferred()) is inferred


def test_the_config_modules_import_no_circle():
    """rlvr.config is a leaf of plain modules: the sections are read by the rules
    (config/validate.py), never the reverse; no two of its modules reach each other (type-only
    imports counted: they are a circle to a reader and to a type checker)."""
    import grimp

    graph = grimp.build_graph("rlvr")
    modules = sorted(m for m in graph.find_descendants("rlvr.config"))
    circles = [
        (a, b)
        for i, a in enumerate(modules)
        for b in modules[i + 1 :]
        if graph.find_shortest_chain(importer=a, imported=b)
        and graph.find_shortest_chain(importer=b, imported=a)
    ]
    assert circles == []
    assert graph.find_shortest_chain(
        importer="rlvr.config.validate", imported="rlvr.config.sections"
    )
