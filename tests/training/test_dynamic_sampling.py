"""algo.dynamic_sampling (DAPO, arXiv 2503.14476): keep drawing prompts until the step has
algo.prompts_per_step groups whose rewards differ."""

from __future__ import annotations

import pytest
import torch
from test_train_e2e import tiny_config

from rlvr.algorithms import overlong_penalty
from rlvr.objectives.batch import RolloutBatch
from rlvr.rewards.runner import BatchRewards
from rlvr.rollout.base import Completion
from rlvr.training.dynamic_sampling import assemble, filter_values, informative_groups
from rlvr.training.preflight.checks import config_problems
from rlvr.training.trainer import Trainer


def _scored(
    name: str, scores: list[list[float]], correct: list[list[float]] | None = None
) -> RolloutBatch:
    p, g = len(scores), len(scores[0])
    groups = [[Completion(i, [1], [0.0], f"{name}{i}", "stop") for _ in range(g)] for i in range(p)]
    flat = [x for row in scores for x in row]
    b = RolloutBatch(
        [{"id": f"{name}{i}"} for i in range(p)],
        [f"{name}{i}" for i in range(p)],
        [[1]] * p,
        groups,
        g,
    )
    infos = (
        [{}] * len(flat) if correct is None else [{"correct": c} for row in correct for c in row]
    )
    b.rewards = BatchRewards(flat, infos, [True] * len(flat), [f"fail-{name}"])
    b.scores = torch.tensor(scores)
    b.valid = torch.ones(p, g, dtype=torch.bool)
    return b


def test_informative_groups_by_hand():
    # [1, 1] equal; [0, 1] differ; [0, nan-as-invalid] has one valid reward: not informative
    scores = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 5.0]])
    valid = torch.tensor([[True, True], [True, True], [True, False]])
    assert informative_groups(scores, valid) == [False, True, False]


def test_assemble_keeps_informative_groups_then_fills():
    # round a: a0 equal, a1 differs; round b: b0 differs, b1 equal. Need 2: a1 and b0.
    a = _scored("a", [[1.0, 1.0], [0.0, 1.0]])
    b = _scored("b", [[0.0, 2.0], [3.0, 3.0]])
    batch, kept = assemble([a, b], 2)
    assert kept == 2 and [r["id"] for r in batch.rows] == ["a1", "b0"]
    assert batch.scores.tolist() == [[0.0, 1.0], [0.0, 2.0]]
    assert batch.rewards.scores == [0.0, 1.0, 0.0, 2.0]
    assert batch.rewards.failures == ["fail-a", "fail-b"]  # every round's, once
    # need 3: one equal-reward group fills up (the first in drawing order, a0)
    batch, kept = assemble([a, b], 3)
    assert kept == 2 and [r["id"] for r in batch.rows] == ["a0", "a1", "b0"]


def test_an_all_correct_group_of_different_lengths_is_not_informative():
    """recipes/dapo.yaml: max 20,480 tokens, overlong buffer 4,096 (the penalty starts at 16,384).
    Four correct replies of 100 / 19,000 / 20,000 / 500 tokens score 1, 1 - 2616/4096,
    1 - 3616/4096, 1: different scores, one accuracy. DAPO filters on accuracy, so with one group
    to keep, the mixed group a1 (one of four right) wins over a0; filtering on the
    shaped score (the old behaviour) kept a0, the first drawn."""
    pen = overlong_penalty(
        torch.tensor([[100, 19_000, 20_000, 500], [50, 60, 70, 80]]), 20_480, 4096
    )
    assert pen[0].tolist() == pytest.approx([0.0, -2616 / 4096, -3616 / 4096, 0.0])
    correct = [[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]]
    a = _scored("a", (torch.tensor(correct) + pen).tolist(), correct)
    assert informative_groups(a.scores, a.valid) == [True, True]  # the shaped scores differ
    assert informative_groups(filter_values(a, "accuracy"), a.valid) == [False, True]
    batch, kept = assemble([a], 1)  # the default metric: accuracy
    assert (kept, [r["id"] for r in batch.rows]) == (1, ["a1"])
    batch, kept = assemble([a], 1, "score")
    assert (kept, [r["id"] for r in batch.rows]) == (1, ["a0"])


def test_accuracy_falls_back_to_the_unshaped_score_without_a_correct_info():
    # no 'correct' info: the reward's own scores (rewards.scores) decide, not batch.scores, which
    # here carries a penalty that makes group 0 differ
    a = _scored("a", [[0.5, 0.5], [0.0, 1.0]])
    a.scores = torch.tensor([[0.5, 0.2], [0.0, 1.0]])
    assert filter_values(a, "accuracy").tolist() == [[0.5, 0.5], [0.0, 1.0]]
    assert informative_groups(filter_values(a, "accuracy"), a.valid) == [False, True]


def test_accuracy_and_score_disagree_in_the_loop(tiny_model_dir, tmp_path):
    """A reward whose score differs between replies but whose verifier calls them all wrong:
    filtering on accuracy finds no informative group in 3 rounds, filtering on score keeps 4
    groups from the first round."""
    m, _ = _run(tiny_model_dir, tmp_path / "acc", "checksum_never_correct", 3)
    assert (m["ds_rounds"], m["ds_prompts_kept"]) == (3.0, 0.0)
    m, _ = _run(
        tiny_model_dir,
        tmp_path / "score",
        "checksum_never_correct",
        3,
        "algo.dynamic_sampling_metric=score",
    )
    assert (m["ds_rounds"], m["ds_prompts_kept"]) == (1.0, 4.0)


def _run(tiny_model_dir, tmp_path, reward: str, rounds: int, *extra: str):
    cfg = tiny_config(
        tiny_model_dir,
        tmp_path,
        f"reward.specs=[{{name: 'toy_rewards:{reward}'}}]",
        "algo.dynamic_sampling=true",
        f"algo.dynamic_sampling_max_rounds={rounds}",
        "train.max_steps=1",
        "eval.before_after=false",
        *extra,
    )
    trainer = Trainer(cfg)
    m = trainer.train_step()
    batch = trainer.last_batch
    trainer.run.close()
    return m, batch


def test_only_groups_whose_rewards_differ_are_kept(tiny_model_dir, tmp_path):
    """Even answers score 0 for every reply, odd ones vary: after enough rounds the step's 4
    groups are all odd-answer groups, and no kept group has equal rewards."""
    m, batch = _run(tiny_model_dir, tmp_path, "varies_on_odd_answers", 8)
    assert m["ds_prompts_kept"] == 4.0 and m["zero_var_group_frac"] == 0.0
    assert m["ds_prompts_drawn"] == 4.0 * m["ds_rounds"] and m["ds_rounds"] >= 2
    assert len(batch.rows) == 4 and all(int(float(r["answer"])) % 2 for r in batch.rows)
    assert batch.scores.shape == (4, 8)


def test_the_rounds_run_out_and_the_batch_is_filled(tiny_model_dir, tmp_path):
    """Reward always 0: no group ever differs; 3 rounds of 4 prompts are drawn, none kept, and
    the step still trains on 4 (equal-reward) groups."""
    m, batch = _run(tiny_model_dir, tmp_path, "always_zero", 3)
    assert (m["ds_rounds"], m["ds_prompts_drawn"], m["ds_prompts_kept"]) == (3.0, 12.0, 0.0)
    assert m["zero_var_group_frac"] == 1.0 and len(batch.rows) == 4
    # the generation rate counts the 3 rounds' replies (about 3 x the kept batch's 32), not 32
    generated = m["gen_tokens_per_s"] * m["time_rollout"]
    assert generated > 2 * 32 * m["response_len_mean"]
    assert "ds_gen_tokens" not in m


def test_the_dapo_recipe_validates_with_the_paper_settings():
    from pathlib import Path

    from rlvr.config import load_config

    cfg = load_config(str(Path(__file__).resolve().parents[2] / "recipes" / "dapo.yaml"), [])
    a, r = cfg.algo, cfg.reward
    assert (a.objective, a.clip_low, a.clip_high, a.loss_agg) == ("grpo", 0.2, 0.28, "token_mean")
    assert a.dynamic_sampling and a.beta == 0.0 and a.dynamic_sampling_metric == "accuracy"
    assert r.overlong_buffer / cfg.rollout.max_new_tokens == 4096 / 20480
    assert config_problems(cfg) == []


def test_two_ranks_keep_drawing_together(tiny_model_dir, tmp_path):
    """torchrun, 2 CPU ranks: each rank holds 2 of the 4 prompts per round and fills its own 2
    informative groups; generation and scoring are collective, so both ranks draw the same
    number of rounds (a rank that is full keeps drawing while the other is short). The run
    finishes and the global batch holds 4 informative groups."""
    from dist_support import TORCHRUN, run, train_args
    from dist_support import steps as run_steps

    args = train_args(tiny_model_dir, tmp_path, "two", 2, "train.parallel=ddp")
    args = [a for a in args if not a.startswith("reward.specs")]
    args += [
        "reward.specs=[{name: 'toy_rewards:varies_on_odd_answers'}]",
        "algo.dynamic_sampling=true",
        "algo.dynamic_sampling_max_rounds=8",
    ]
    run(TORCHRUN, args, tmp_path)
    steps = run_steps(tmp_path / "two")
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert m["ds_prompts_kept"] == 4.0 and m["zero_var_group_frac"] == 0.0
        assert m["ds_prompts_drawn"] == 4.0 * m["ds_rounds"]


def test_assemble_keeps_each_prompts_images_with_it():
    """Image prompts: the kept groups carry their own vision inputs in the new order; a round of
    text-only prompts contributes prompts without images."""
    from rlvr.data.multimodal import PromptVision

    a = _scored("a", [[1.0, 1.0], [0.0, 1.0]])
    b = _scored("b", [[0.0, 2.0], [3.0, 3.0]])
    a.vision = [
        PromptVision([f"img-a{i}"], {"pixel_values": torch.full((1, 2), i)}) for i in (0, 1)
    ]
    batch, _ = assemble([a, b], 3)  # a0, a1, b0
    assert [v.images for v in batch.vision] == [["img-a0"], ["img-a1"], []]
    assert batch.vision[1].inputs["pixel_values"].tolist() == [[1, 1]]
    assert [v.images for v in batch.seq_vision] == [["img-a0"]] * 2 + [["img-a1"]] * 2 + [[]] * 2
    assert assemble([b], 1)[0].vision is None  # text prompts only: no vision at all
