from __future__ import annotations

import dataclasses
import re

import pytest

from benchmarks.harness.workloads import (
    WORKLOADS,
    check_workload,
    get_workload,
    prompt_digest,
    step_schedule,
)


def test_unknown_workload_lists_known_ones():
    with pytest.raises(ValueError, match="known: quick, default, long, target"):
        get_workload("fast")


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_builtin_workloads_are_runnable(name):
    w = get_workload(name)
    check_workload(w, w.steps)
    assert w.warmup < w.steps


def test_issue_settings():
    # issue 10: default 16 x 64, long group 16 x 128, target 4 x 8 x 48 at lr 2e-5 to 0.9
    d, lg, t = get_workload("default"), get_workload("long"), get_workload("target")
    assert (d.sequences, d.max_new_tokens) == (16, 64)
    assert (lg.group_size, lg.max_new_tokens) == (16, 128)
    assert (t.prompts_per_step, t.group_size, t.max_new_tokens, t.lr) == (4, 8, 48, 2e-5)
    assert (t.target_reward, t.target_window) == (0.9, 3)


def test_check_workload_names_the_bad_field():
    w = dataclasses.replace(get_workload("default"), micro_batch=6)
    with pytest.raises(ValueError, match="micro_batch=6 must divide"):
        check_workload(w, 4)
    # 8 x 3 = 24 sequences split into micro-batches of 8: fine on both sides (rlvr's
    # micro-batches need not hold whole groups)
    check_workload(
        dataclasses.replace(get_workload("default"), group_size=3, prompts_per_step=8), 4
    )
    with pytest.raises(ValueError, match="--steps=0"):
        check_workload(get_workload("default"), 0)


def test_prompt_digest_depends_on_order_and_boundaries():
    assert prompt_digest(["a", "b"]) != prompt_digest(["b", "a"])
    assert prompt_digest(["ab", ""]) != prompt_digest(["a", "b"])
    assert prompt_digest(["a", "b"]) == prompt_digest(["a", "b"])


def test_schedule_holds_correct_arithmetic_in_chat_form(tiny_tokenizer):
    w = get_workload("target")
    sched = step_schedule(w, 5, tiny_tokenizer, seed=0)
    assert len(sched) == 5 and all(len(step) == w.prompts_per_step for step in sched)
    ops = {"+": lambda a, b: a + b, "*": lambda a, b: a * b}
    for row in (r for step in sched for r in step):
        assert row["prompt"].startswith("<|im_start|>user\n")
        assert row["prompt"].endswith("<|im_start|>assistant\n")
        a, op, b = re.search(r"What is (\d) ([+*]) (\d)\?", row["prompt"]).groups()
        assert row["answer"] == str(ops[op](int(a), int(b)))
    # a new seed draws a different order
    assert step_schedule(w, 5, tiny_tokenizer, seed=1) != sched


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from rlvr.training.tiny import build_char_tokenizer

    return build_char_tokenizer()


def test_worker_spec_carries_the_workload_and_the_run():
    spec = get_workload("target").worker_spec("/m", seed=3, threads=2, steps=40)
    assert spec == {
        "model_dir": "/m",
        "prompts_per_step": 4,
        "group_size": 8,
        "max_new_tokens": 48,
        "micro_batch": 8,
        "lr": 2e-5,
        "steps": 40,
        "seed": 3,
        "threads": 2,
        "precision": "bf16",  # a run that does not choose gets what the workers default to
    }
    quick = get_workload("quick").worker_spec("/m", seed=0, threads=1, steps=1, precision="float32")
    assert (quick["prompts_per_step"], quick["group_size"], quick["precision"]) == (2, 4, "float32")
