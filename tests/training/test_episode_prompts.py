"""Episodes start from the environment's ``reset(row)``, not from ``row["prompt"]``: the prompt
checks (setup, the dry run) and the memory plan count that first prompt, rendered as the
episodes render it, from environments built through the registry, reset and closed."""

from __future__ import annotations

import pytest
from test_train_e2e import tiny_config

from rlvr.config import ConfigError
from rlvr.training.preflight.dry_run import make_plan
from rlvr.training.setup import setup_run
from user_envs import LongFirstPrompt

ENV = ("env.name=user_envs:LongFirstPrompt", "env.kwargs={length: 100}")


def _cfg(model_dir, out, *extra):
    # row prompts "What is A * B?" have at most 17 characters: 17 tokens of the tiny tokenizer
    return tiny_config(
        model_dir,
        out,
        "data.task=arithmetic",
        "data.num_train=6",
        "data.num_eval=2",
        "rollout.max_episode_tokens=16",
        *ENV,
        *extra,
    )


def test_setup_refuses_an_episode_prompt_over_the_limit_naming_the_row_and_the_knob(
    tiny_model_dir, tmp_path
):
    made, closed = LongFirstPrompt.made, LongFirstPrompt.closed
    cfg = _cfg(tiny_model_dir, tmp_path, "data.max_prompt_tokens=64")
    with pytest.raises(ConfigError) as err:
        setup_run(cfg)
    text = str(err.value)
    assert "train row 0: its episodes' first prompt (env.reset of " in text
    assert "has 100 tokens after the template, more than data.max_prompt_tokens=64" in text
    # every environment the check built was closed (the registry's probe included)
    assert LongFirstPrompt.made - made == LongFirstPrompt.closed - closed > 0


def test_the_dry_run_counts_the_episode_prompt(tiny_model_dir, tmp_path):
    plan = make_plan(_cfg(tiny_model_dir, tmp_path, "data.max_prompt_tokens=64"))
    assert plan.longest_prompt_tokens == 100 and plan.example_tokens == 100
    assert plan.example_prompt == "x" * 100
    [p] = [p for p in plan.problems if "max_prompt_tokens" in p]
    assert "has 100 tokens" in p and "train row 0" in p
    fits = make_plan(_cfg(tiny_model_dir, tmp_path, "data.max_prompt_tokens=100"))
    assert not [p for p in fits.problems if "max_prompt_tokens" in p]


def test_the_memory_plan_sizes_rows_by_the_prompts_the_run_sends(tiny_model_dir, tmp_path):
    """setup_run counts the prompts before any weights load and plans at the longest of them
    (not data.max_prompt_tokens=256); with episodes, at the first prompt env.reset gives (100
    characters) and the episode's tokens after it (rollout.max_episode_tokens=16)."""
    cfg = tiny_config(tiny_model_dir, tmp_path / "a", "data.num_train=6", "data.num_eval=2")
    run, _ = setup_run(cfg)
    try:
        prompts = [r["prompt"] for r in run.train_rows + run.eval_rows]
        # the premise: one token per character (template none)
        assert [len(run.tokenizer(p, add_special_tokens=False).input_ids) for p in prompts] == [
            len(p) for p in prompts
        ]
        spec = run.memory_plan.spec
        assert spec.prompt_tokens == max(map(len, prompts)) < cfg.data.max_prompt_tokens
        assert spec.completion_tokens == cfg.rollout.max_new_tokens == 8
    finally:
        run.close()
    run, _ = setup_run(_cfg(tiny_model_dir, tmp_path / "b", "data.max_prompt_tokens=128"))
    try:
        spec = run.memory_plan.spec
        assert (spec.prompt_tokens, spec.completion_tokens) == (100, 16)
    finally:
        run.close()


def test_the_dry_run_calls_a_reward_with_the_prompt_training_passes(tiny_model_dir, tmp_path):
    """Training scores a reply against the text the run sent (here env.reset's 100-character
    first prompt); the dry run's call of each own reward passed the raw row question
    ("What is A * B?"), so a reward reading its prompt answered differently there."""
    cfg = _cfg(
        tiny_model_dir,
        tmp_path,
        "data.max_prompt_tokens=128",
        "reward.specs=[{name: 'toy_rewards:prompt_length'}]",
    )
    [check] = make_plan(cfg).reward_checks
    assert check.endswith("returned 100.0"), check
