"""The `eval` config section (named sets, modes, best metric, early stop) and set building."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.config import ConfigError, load_config
from rlvr.eval.evaluator import EvalOutcome, sampling_params
from rlvr.eval.sets import build_eval_sets


def test_default_eval_is_greedy_before_and_after_on_heldout() -> None:
    """`make demo` (no config) must still report greedy_pass@1 on the held-out split."""
    ev = load_config(None).eval
    assert ev.before_after is True and ev.every == 0
    assert ev.metric_names() == ["eval/heldout/greedy_pass@1"]
    assert ev.best_metric_name() == "eval/heldout/greedy_pass@1"
    assert ev.early_stop.enabled is False and ev.early_stop.patience == 2
    assert ev.early_stop_metric_name() == "eval/heldout/greedy_pass@1"


def test_named_sets_and_modes_give_metrics_named_after_set_and_mode(tmp_path: Path) -> None:
    ev = load_config(
        None,
        [
            "eval.modes=[greedy, {kind: sampling, k: 4}]",
            f"eval.sets=[{{name: heldout}}, {{name: ood_probe, path: {tmp_path}/o.jsonl, "
            "modes: [greedy]}]",
            "eval.best_metric=eval/ood_probe/greedy_pass@1",
            "eval.early_stop.enabled=true",
        ],
    ).eval
    # heldout runs both modes (greedy: 1 metric, sampling k=4: 3 metrics); ood_probe greedy only
    assert ev.metric_names() == [
        "eval/heldout/greedy_pass@1",
        "eval/heldout/sampling_pass@4",
        "eval/heldout/maj@4",
        "eval/heldout/mean_acc@4",
        "eval/ood_probe/greedy_pass@1",
    ]
    assert ev.early_stop_metric_name() == "eval/ood_probe/greedy_pass@1"


def test_a_bare_sampling_mode_takes_the_seed_defaults() -> None:
    (greedy, sampling) = load_config(None, ["eval.modes=[greedy, sampling]"]).eval.modes
    # the usual sampling_pass@8 setting: temperature 0.6, n 8
    assert sampling.describe() == {"mode": "sampling", "k": 8, "temperature": 0.6, "top_p": 1.0}
    assert greedy.describe() == {"mode": "greedy", "k": 1, "temperature": 0.0, "top_p": 1.0}
    assert sampling_params(greedy, 8).temperature == 0.0
    params = sampling_params(sampling, 8, seed=3, num_prompts=2)
    assert (params.n, params.temperature, params.prompt_seeds) == (8, 0.6, (3, 4))


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "eval.best_metric=eval/heldout/greedy_pass@2",
            "eval.best_metric='eval/heldout/greedy_pass@2' is not a metric this config produces; "
            "did you mean 'eval/heldout/greedy_pass@1'?",
        ),
        ("eval.early_stop.metric=eval/ood/greedy_pass@1", "known: eval/heldout/greedy_pass@1"),
        (
            "eval.sets=[{name: a, path: x.jsonl, split: train}]",
            "eval set 'a': give one of path, split or task, not path and split",
        ),
        ("eval.sets=[{name: probe}]", "eval set 'probe' has no rows"),
        ("eval.sets=[{name: probe, pth: x.jsonl}]", "unknown key 'pth'; did you mean 'path'?"),
        ("eval.modes=[{kind: greedy, k: 8}]", "use kind: sampling for k samples"),
        ("eval.modes=[greedy, greedy]", "one mode per kind"),
        ("eval.modes=[{kind: beam}]", "eval.modes[0].kind"),
        ("eval.sets=[{name: heldout, modes: [sampling]}]", "are not in eval.modes"),
        ("eval.sets=[{name: heldout}, {name: heldout}]", "repeated: ['heldout']"),
        ("eval.sets=[{name: a/b, path: x.jsonl}]", "eval.sets[0].name"),
        ("eval.early_stop.patience=0", "eval.early_stop.patience"),
    ],
)
def test_bad_eval_config_names_the_field(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert message in str(err.value)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_sets_load_their_rows_from_file_split_and_task(tmp_path: Path) -> None:
    probe = write_jsonl(
        tmp_path / "ood.jsonl",
        [{"question": f"What is {i} squared?", "label": i * i} for i in range(6)],
    )
    cfg = load_config(
        None,
        [
            "eval.max_problems=4",
            "eval.modes=[greedy, {kind: sampling, k: 2}]",
            "eval.sets=["
            "{name: heldout, max_problems: 3}, "
            "{name: id_probe, split: train, max_problems: 2, modes: [greedy]}, "
            f"{{name: ood_probe, path: {probe}, prompt_field: question, answer_field: label}}, "
            "{name: two_digit, task: arithmetic, task_kwargs: {digits: 2}, max_problems: 3}]",
        ],
    )
    heldout = [{"prompt": f"h{i}", "answer": str(i)} for i in range(10)]
    train = [{"prompt": f"t{i}", "answer": str(i)} for i in range(10)]
    sets = build_eval_sets(cfg, heldout_rows=lambda: heldout, train_rows=lambda: train)
    by_name = {s.name: s for s in sets}
    assert [s.name for s in sets] == ["heldout", "id_probe", "ood_probe", "two_digit"]
    assert by_name["heldout"].rows == heldout[:3]
    assert by_name["id_probe"].rows == train[:2]
    assert [m.kind for m in by_name["id_probe"].modes] == ["greedy"]
    assert [m.kind for m in by_name["heldout"].modes] == ["greedy", "sampling"]
    # the file set falls back to eval.max_problems = 4 and reads the renamed fields
    ood = by_name["ood_probe"].rows
    assert [r["prompt"] for r in ood] == [f"What is {i} squared?" for i in range(4)]
    assert [r["answer"] for r in ood] == ["0", "1", "4", "9"]
    # a generated set: 3 problems whose two operands both have two digits
    two = by_name["two_digit"].rows
    assert len(two) == 3
    for row in two:
        words = row["prompt"].rstrip("?").split()  # "What is a op b"
        assert 10 <= int(words[2]) <= 99 and 10 <= int(words[4]) <= 99


def test_only_the_splits_a_set_needs_are_built(tmp_path: Path) -> None:
    cfg = load_config(None, ["eval.max_problems=2"])

    def no_train() -> list[dict]:
        raise AssertionError("the train split was built although no set uses it")

    sets = build_eval_sets(
        cfg, heldout_rows=lambda: [{"prompt": "p", "answer": "1"}] * 5, train_rows=no_train
    )
    assert [(s.name, len(s.rows)) for s in sets] == [("heldout", 2)]


def test_a_run_without_heldout_split(tmp_path: Path) -> None:
    # by default there is then nothing to evaluate (no error, as before named sets existed)
    cfg = load_config(None)
    assert build_eval_sets(cfg, heldout_rows=list, train_rows=list) == []
    # asking for it by name is an error that says why
    cfg = load_config(None, ["eval.sets=[{name: heldout}]"])
    with pytest.raises(ValueError, match="wants the held-out split, but this run has none"):
        build_eval_sets(cfg, heldout_rows=list, train_rows=list)
    with pytest.raises(ValueError, match=r"\['nope'\] are not configured; known: heldout"):
        build_eval_sets(cfg, heldout_rows=list, train_rows=list, only=["nope"])


def test_logged_metrics_leave_problem_counts_in_the_file() -> None:
    outcome = EvalOutcome(
        results={
            "heldout": {"greedy_pass@1": 0.5, "greedy/num_prompts": 4},
            "ood": {"maj@4": 0.25, "sampling/num_prompts": 4},
        }
    )
    assert outcome.metrics() == {"eval/heldout/greedy_pass@1": 0.5, "eval/ood/maj@4": 0.25}
