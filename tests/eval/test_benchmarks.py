"""The standard benchmarks by name (rlvr.config.benchmarks): each resolves to its hub id, split
and fields, reads fixture rows in the dataset's own schema through `datasets.load_dataset`, and
its grader scores a right and a wrong reply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlvr.config import load_config
from rlvr.config.benchmarks import BENCHMARKS
from rlvr.config.eval import EvalConfig, EvalSetConfig
from rlvr.eval.sets import build_eval_sets, set_rows
from rlvr.training.preflight.checks import config_problems

# name: (hub id, config, split, fixture rows in the dataset's schema, prompt, answer, right, wrong)
CASES: dict[str, tuple] = {
    "math500": (
        "HuggingFaceH4/MATH-500",
        None,
        "test",
        [
            {
                "problem": "Compute $\\frac{1}{2}+\\frac{1}{4}$.",
                "solution": "We get $\\boxed{\\frac{3}{4}}$.",
                "answer": "\\frac{3}{4}",
                "subject": "Prealgebra",
                "level": 1,
                "unique_id": "test/prealgebra/1.json",
            }
        ],
        "Compute $\\frac{1}{2}+\\frac{1}{4}$.",
        "\\frac{3}{4}",
        "So the sum is \\boxed{\\frac{3}{4}}.",
        "So the sum is \\boxed{\\frac{2}{3}}.",
    ),
    "aime24": (
        "HuggingFaceH4/aime_2024",
        None,
        "train",
        [{"id": 60, "problem": "Find m+n.", "solution": "...", "answer": "204", "url": "u"}],
        "Find m+n.",
        "204",
        "Thus m+n = \\boxed{204}.",
        "Thus m+n = \\boxed{240}.",
    ),
    "aime25": (
        "math-ai/aime25",
        None,
        "test",
        [{"problem": "Find the sum of all bases b.", "answer": "70", "id": "0"}],
        "Find the sum of all bases b.",
        "70",
        "\\boxed{70}",
        "\\boxed{7}",
    ),
    "amc23": (
        "math-ai/amc23",
        None,
        "test",
        [{"id": 0, "question": "How many miles from A?", "answer": 27.0, "url": "u"}],
        "How many miles from A?",
        "27",  # the float 27.0 of the dataset reads as 27
        "They meet \\boxed{27} miles from A.",
        "They meet \\boxed{18} miles from A.",
    ),
    "gsm8k": (
        "openai/gsm8k",
        "main",
        "test",
        [
            {
                "question": "Janet sells 16 - 3 - 4 eggs at $2.",
                "answer": "9 * 2 = <<9*2=18>>18\n#### 18",
            }
        ],
        "Janet sells 16 - 3 - 4 eggs at $2.",
        "18",
        "She makes 9 * 2 = 18 dollars.\n#### 18",
        "She makes 16 * 2 = 32 dollars.\n#### 32",
    ),
    "minerva_math": (
        "math-ai/minervamath",
        None,
        "test",
        [{"question": "Compute the ratio.", "answer": "0.25"}],
        "Compute the ratio.",
        "0.25",
        "The ratio is \\boxed{0.25}.",
        "The ratio is \\boxed{0.5}.",
    ),
    "olympiadbench": (
        "Hothan/OlympiadBench",
        "OE_TO_maths_en_COMP",
        "train",
        [
            {
                "id": 1606,
                "question": "Determine x.",
                "solution": ["..."],
                "final_answer": ["$\\frac{1}{2}$"],
                "is_multiple_answer": False,
                "unit": None,
                "answer_type": "Numerical",
            }
        ],
        "Determine x.",
        "$\\frac{1}{2}$",
        "Hence $x = \\boxed{\\frac{1}{2}}$.",
        "Hence $x = \\boxed{\\frac{1}{3}}$.",
    ),
}


def test_every_named_benchmark_has_a_fixture() -> None:
    hub = sorted(name for name, b in BENCHMARKS.items() if b.path.startswith("hf:"))
    assert sorted(CASES) == hub
    assert hub == sorted(
        ["math500", "aime24", "aime25", "amc23", "gsm8k", "minerva_math", "olympiadbench"]
    )
    # the one set read from a package, not the hub: tests/eval/test_humaneval.py
    assert sorted(set(BENCHMARKS) - set(hub)) == ["humaneval"]


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict]]:
    """`datasets.load_dataset` answering each benchmark's hub id with its fixture rows."""
    import datasets

    by_id = {case[0]: case[3] for case in CASES.values()}
    calls: list[tuple[str, dict]] = []

    def load_dataset(location: str, **kw: Any) -> datasets.Dataset:
        calls.append((location, kw))
        if location not in by_id:
            raise ConnectionError(f"Couldn't reach {location!r} on the Hub (offline test)")
        return datasets.Dataset.from_list(by_id[location])

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


@pytest.mark.parametrize("name", sorted(CASES))
def test_benchmark_resolves_reads_and_grades(name: str, fake_hub: list) -> None:
    from rlvr.rewards.registry import BUILTIN_REWARDS

    repo, config, split, _, prompt, answer, right, wrong = CASES[name]
    cfg = load_config(None, [f"eval.sets=[{{name: {name}}}]"])
    set_cfg = cfg.eval.sets[0]
    rows = set_rows(set_cfg, cfg, heldout_rows=list, train_rows=list)
    assert fake_hub == [
        (repo, dict(name=config, split=split, revision=None, streaming=False)),
    ]
    assert [(r["prompt"], r["answer"]) for r in rows] == [(prompt, answer)]
    grader = set_cfg.resolved().grader
    assert grader == ("gsm8k" if name == "gsm8k" else "math")
    reward = BUILTIN_REWARDS[grader]()
    assert reward(prompt, right, answer).score == 1.0
    assert reward(prompt, wrong, answer).score == 0.0


def test_a_set_entry_overrides_the_benchmark(tmp_path: Path) -> None:
    """A local copy of GSM8K in hub layout: the gsm8k fields, extraction and grader still apply."""
    import datasets

    folder = tmp_path / "gsm8k"
    folder.mkdir()
    (folder / "README.md").write_text("# local gsm8k copy\n")
    (folder / "test.jsonl").write_text('{"question": "q?", "answer": "1 + 1 = 2\\n#### 2"}\n')
    monkey_cache = tmp_path / "cache"
    old = datasets.config.HF_DATASETS_CACHE
    datasets.config.HF_DATASETS_CACHE = monkey_cache
    try:
        cfg = load_config(None, [f"eval.sets=[{{name: gsm8k, path: '{folder}?split=test'}}]"])
        resolved = cfg.eval.sets[0].resolved()
        assert (resolved.path, resolved.prompt_field, resolved.grader) == (
            f"{folder}?split=test",
            "question",
            "gsm8k",
        )
        rows = set_rows(cfg.eval.sets[0], cfg, heldout_rows=list, train_rows=list)
    finally:
        datasets.config.HF_DATASETS_CACHE = old
    assert [(r["prompt"], r["answer"]) for r in rows] == [("q?", "2")]


def test_unknown_set_name_suggests_a_benchmark() -> None:
    with pytest.raises(ValueError, match=r"'math5000' has no rows \(did you mean 'math500'\?\)"):
        EvalSetConfig(name="math5000")
    cfg = EvalConfig(sets=[{"name": "math500"}, {"name": "aime24"}])
    assert cfg.metric_names() == ["eval/math500/greedy_pass@1", "eval/aime24/greedy_pass@1"]


def test_sets_by_name_need_no_configuration(fake_hub: list) -> None:
    cfg = load_config(None, ["eval.max_problems=5"])
    sets = build_eval_sets(cfg, heldout_rows=list, train_rows=list, only=["math500", "gsm8k"])
    assert [(s.name, len(s.rows), s.grader) for s in sets] == [
        ("math500", 1, "math"),
        ("gsm8k", 1, "gsm8k"),
    ]
    with pytest.raises(ValueError, match=r"\['mathh'\] are not configured.*standard benchmarks"):
        build_eval_sets(cfg, heldout_rows=list, train_rows=list, only=["mathh"])


def test_a_set_grader_gets_its_own_runner_unless_the_run_has_it() -> None:
    from rlvr.config.reward import RewardSpec
    from rlvr.eval.evaluator import _runner_for

    class Run:
        specs = [RewardSpec(name="math")]
        timeout_s = 2.0

    run, own = Run(), {}
    assert _runner_for(None, run, own) is run
    assert _runner_for("math", run, own) is run and own == {}
    gsm = _runner_for("gsm8k", run, own)
    try:
        assert gsm is not run and own == {"gsm8k": gsm}
        assert [s.name for s in gsm.specs] == ["gsm8k"] and gsm.timeout_s == 2.0
        assert _runner_for("gsm8k", run, own) is gsm  # one runner per grader
    finally:
        gsm.close()


def test_rlvr_eval_named_sets_prints_one_table(
    tiny_model_dir: Path, tmp_path: Path, fake_hub: list, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from rlvr.cli.main import main

    out_file = tmp_path / "eval.json"
    argv = ["eval", str(tiny_model_dir), "--sets", "math500,gsm8k", "--max-new-tokens", "4"]
    assert main([*argv, "--out", str(out_file), "data.template=none", "rollout.engine=hf"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ")]
    assert rows[1:] == ["math500 greedy_pass@1", "gsm8k greedy_pass@1"], out  # one table
    assert [repo for repo, _ in fake_hub] == ["HuggingFaceH4/MATH-500", "openai/gsm8k"]
    results = json.loads(out_file.read_text())["results"]
    assert sorted(results) == ["gsm8k", "math500"]
    assert [repo for repo, _ in fake_hub] == ["HuggingFaceH4/MATH-500", "openai/gsm8k"]


def test_an_unknown_set_grader_is_a_config_problem() -> None:
    cfg = load_config(None, ["eval.sets=[{name: math500, grader: maths}]"])
    problems = config_problems(cfg)
    assert len(problems) == 1
    assert problems[0].startswith("eval.sets[0] (math500).grader: reward spec 'maths': unknown")
