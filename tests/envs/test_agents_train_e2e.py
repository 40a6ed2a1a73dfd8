"""Agents train end to end on a tiny model through the OpenAI endpoint: an OpenAI-client agent
(`env.name=agent:...`), one that rewrites its history (split sequences, counted), a verifiers
environment (`env.name=verifiers:...`), and two ranks each serving their own episodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.training.dist_support import TORCHRUN, run, steps

from rlvr.config import ConfigError, load_config
from rlvr.telemetry.samples import samples_path
from rlvr.training.trainer import Trainer

pytest.importorskip("openai")

COMMON = [
    "data.template=chat",
    "data.max_prompt_tokens=128",
    "rollout.max_new_tokens=12",
    "rollout.max_episode_tokens=900",
    "rollout.max_turns=3",
    "algo.prompts_per_step=2",
    "algo.group_size=3",
    "algo.objective=grpo",
    "algo.beta=0.05",
    "train.max_steps=2",
    "eval.before_after=false",
    "logging.progress=false",
    "logging.samples_every=1",
    "env.timeout_s=120",
]


@pytest.fixture(scope="module")
def long_tiny(tmp_path_factory) -> Path:
    """The tiny model with 2048 positions: an agent's tools block alone is ~560 characters."""
    from rlvr.training.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("agents") / "model", max_positions=2048)


def _fit(model: Path, out: Path, *extra: str) -> list[dict]:
    cfg = load_config(
        None, [f"model.name_or_path={model}", f"train.output_dir={out}", *COMMON, *extra]
    )
    summary = Trainer(cfg).fit()
    run_dir = Path(summary["run_dir"])
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()], run_dir


def test_an_openai_client_agent_trains_two_steps(long_tiny, tmp_path):
    lines, run_dir = _fit(long_tiny, tmp_path, "env.name=agent:user_agents:three_turn_agent")
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["turns_mean"] == 3.0 and m["env_failure_rate"] == 0.0
        assert m["agent_splits"] == 0.0
        assert m["episode_env_tokens_mean"] > 0  # the prompts' follow-ups, masked
        # the trainer's log-probs of the sampled tokens, in the context the sequence holds,
        # equal the engine's: the sequence is what the model saw when it sampled them
        assert m["logprob_diff_max"] < 1e-3
        assert m["grad_norm"] > 0
    samples = [json.loads(x) for x in samples_path(run_dir, 1).read_text().splitlines()]
    assert len(samples) == 6  # one record per episode


def test_a_history_rewriting_agent_trains_on_split_sequences(long_tiny, tmp_path):
    lines, _ = _fit(long_tiny, tmp_path, "env.name=agent:user_agents:rewriting_agent")
    for m in lines:
        # every one of the 6 episodes split once: 12 sequences, reward metrics per episode
        assert m["agent_splits"] == 6.0
        assert m["turns_mean"] == 3.0
        assert m["logprob_diff_max"] < 1e-3


def test_a_verifiers_tool_environment_trains_two_steps(long_tiny, tmp_path):
    pytest.importorskip("verifiers")
    lines, run_dir = _fit(
        long_tiny, tmp_path, "env.name=verifiers:user_verifiers_env", "env.kwargs.max_turns=2"
    )
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["env_failure_rate"] == 0.0
        assert 1.0 <= m["turns_mean"] <= 2.0
        assert m["logprob_diff_max"] < 1e-3
        assert 0.0 <= m["reward_mean"] <= 2.0  # the rubric's reward
    samples = [json.loads(x) for x in samples_path(run_dir, 1).read_text().splitlines()]
    # the rows are the environment's dataset: "What is i + (i+1)?"
    assert all("What is" in s["prompt"] for s in samples)


def test_a_verifiers_single_turn_environment_trains(long_tiny, tmp_path):
    pytest.importorskip("verifiers")
    lines, _ = _fit(
        long_tiny,
        tmp_path,
        "env.name=verifiers:user_verifiers_env",
        "env.kwargs.kind=single",
        "train.max_steps=1",
    )
    assert lines[0]["turns_mean"] == 1.0 and lines[0]["env_failure_rate"] == 0.0


def test_agents_refuse_a_per_token_objective(long_tiny, tmp_path):
    cfg = load_config(
        None,
        [
            f"model.name_or_path={long_tiny}",
            f"train.output_dir={tmp_path}",
            *COMMON,
            "env.name=agent:user_agents:three_turn_agent",
            "algo.objective=ppo",
        ],
    )
    with pytest.raises(ConfigError, match="algo.objective=ppo with env.name=agent"):
        Trainer(cfg)


def test_two_ranks_each_serve_their_own_episodes(long_tiny, tmp_path):
    args = [
        f"model.name_or_path={long_tiny}",
        f"train.output_dir={tmp_path}",
        "train.run_name=two",
        *COMMON,
        "algo.prompts_per_step=4",
        "env.name=agent:user_agents:rewriting_agent",
        "train.parallel=ddp",
        "model.autocast=off",
        "train.threads=1",
    ]
    run(TORCHRUN, args, tmp_path)
    lines = steps(tmp_path / "two")
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        # 4 prompts x 3 episodes over both ranks, each split once, all played
        assert m["agent_splits"] == 12.0 and m["env_failure_rate"] == 0.0
        assert m["logprob_diff_max"] < 1e-3


def test_split_episodes_train_with_the_gradient_worked_by_hand(long_tiny, tmp_path):
    """Two groups of 3 episodes (user_agents.roles_agent): one group holds a split episode
    (reward 1, two sequences), a one-call episode (0) and a failed one; the other three one-call
    episodes (0, 0.5, 1); the first group is 4 sequences wide, the second 3 and a filler. By
    hand (Dr.GRPO, as SkyRL's step-wise training: the advantage computed over the episodes,
    each episode's earlier sequence given its episode's): A = r - mean over the group's valid
    episodes, so +0.5 / -0.5 (the failed one out, 0) and -0.5 / 0 / +0.5; the loss is
    -sum over valid sequences of A * sum of its model tokens' log-probs / (max_episode_tokens *
    D), D = 6 valid sequences (the split episode's two count, the failed episode and the filler
    do not). The trainer's advantages, its gradient and the logged grad_norm equal those."""
    import torch

    from user_agents import reset_roles

    reset_roles()
    cfg = load_config(
        None,
        [
            f"model.name_or_path={long_tiny}",
            f"train.output_dir={tmp_path}",
            *COMMON,
            "algo.objective=drgrpo",
            "algo.beta=0",
            "train.max_grad_norm=1e6",
            "model.autocast=off",
            "env.name=agent:user_agents:roles_agent",
            "env.max_failure_fraction=0.5",
        ],
    )
    trainer = Trainer(cfg)
    step, model = trainer.step_fn, trainer.state.model
    batch = step.next_batch()
    metrics = step.score(batch)
    comps = batch.completions
    width = batch.group_size
    assert width == 4 and batch.episode_of is not None
    # the layout: each row's episodes, an earlier sequence before its episode's last
    rows = [comps[:width], comps[width:]]
    first = next(r for r in rows if any(c.episode and c.episode.splits for c in r))
    other = rows[1] if first is rows[0] else rows[0]
    assert sum(1 for c in other if c.episode is not None and c.episode.turns) == 3
    assert metrics["agent_splits"] == 1.0 and metrics["env_failure_rate"] == 1 / 6
    assert metrics["reward_mean"] == (1 + 0 + 0 + 0.5 + 1) / 5  # episodes, the failed one out

    # the advantages by hand, from each episode's reward and validity
    hand = {}
    for r in rows:
        eps = {id(c.episode): c.episode for c in r if c.episode is not None and c.episode.turns}
        ok = [e for e in eps.values() if not e.failed]
        mean = sum(e.env_reward for e in ok) / len(ok)
        for e in eps.values():
            hand[id(e)] = 0.0 if e.failed else e.env_reward - mean
    seqs = [
        (c, hand[id(c.episode)])
        for c in comps
        if c.episode is not None and c.episode.turns and not c.episode.failed
    ]
    assert len(seqs) == 6  # 2 + 1 valid in the first row, 3 in the other
    assert sorted(a for _, a in seqs) == [-0.5, -0.5, 0.0, 0.5, 0.5, 0.5]

    # the loss worked by hand on the model as it is before the update
    model.zero_grad(set_to_none=True)
    total = 0.0
    for c, a in seqs:
        ids = torch.tensor([c.prompt_ids + c.token_ids])
        logits = model(input_ids=ids).logits[0, len(c.prompt_ids) - 1 : -1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, ids[0, len(c.prompt_ids) :, None])[:, 0]
        mask = torch.tensor(c.loss_mask, dtype=torch.float32)
        total = total - a * (lp * mask).sum()
    loss = total / (cfg.rollout.max_episode_tokens * len(seqs))
    loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)

    step.logprobs(batch, {})
    prep = step.prepare(batch)
    adv = batch.advantages.tolist()
    assert prep["adv_mean"] == pytest.approx(sum(a for _, a in seqs) / 6)
    by_seq = {id(c): a for c, a in seqs}
    for c, got in zip(comps, adv, strict=True):
        assert got == pytest.approx(by_seq.get(id(c), 0.0))
    from rlvr.training.update import update

    got = {}

    def record(opt, args, kwargs):  # the gradient the optimizer steps with (freed after)
        got.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})

    trainer.state.optimizer.register_step_pre_hook(record)
    out, _ = update(batch, trainer.state, trainer.run)
    assert got.keys() == want.keys()
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-4, atol=1e-7, msg=n)
    norm = torch.cat([g.flatten() for g in want.values()]).norm()
    assert out["grad_norm"] == pytest.approx(float(norm), rel=1e-4)


def test_a_split_episode_pays_the_kl_of_all_its_sequences_in_its_reward(long_tiny, tmp_path):
    """algo.kl_mode=reward subtracts beta x the KL of the policy to the reference, summed over an
    episode's model tokens, from its reward (verl's use_kl_in_reward). An episode the agent split
    holds model tokens in each of its sequences: its reward must pay for all of them, as the same
    tokens in one sequence would, not only for those of its last sequence."""
    import torch

    from rlvr.algorithms import kl_estimate
    from user_agents import reset_roles

    reset_roles()
    beta = 0.5
    cfg = load_config(
        None,
        [
            f"model.name_or_path={long_tiny}",
            f"train.output_dir={tmp_path}",
            *COMMON,
            "algo.objective=drgrpo",
            f"algo.beta={beta}",
            "algo.kl_mode=reward",
            "algo.kl_estimator=k1",
            "model.autocast=off",
            "env.name=agent:user_agents:roles_agent",
            "env.max_failure_fraction=0.5",
        ],
    )
    trainer = Trainer(cfg)
    step = trainer.step_fn
    with torch.no_grad():  # a policy away from its reference (the initial model)
        gen = torch.Generator().manual_seed(0)
        for p in trainer.state.model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    batch = step.next_batch()
    step.score(batch)
    step.logprobs(batch, {})
    comps = batch.completions
    kl = {}  # each episode's KL, summed over the model tokens of all its sequences
    for i, c in enumerate(comps):
        if c.episode is None or not c.episode.turns or c.episode.failed:
            continue
        mask = torch.tensor(c.loss_mask, dtype=torch.float32)
        k = kl_estimate(batch.old_logp[i], batch.ref_logp[i], "k1")
        kl[id(c.episode)] = kl.get(id(c.episode), 0.0) + float((k * mask).sum())
    split = next(c.episode for c in comps if c.episode is not None and c.episode.splits)
    earlier = split.earlier[0]
    i = next(j for j, c in enumerate(comps) if c is earlier)
    assert float(batch.old_logp[i][: len(earlier.loss_mask)].abs().sum()) > 0
    width = batch.group_size
    want = []
    for r in range(len(comps) // width):
        row = comps[r * width : (r + 1) * width]
        eps = {id(c.episode): c.episode for c in row if c.episode is not None and c.episode.turns}
        ok = [e for e in eps.values() if not e.failed]
        scores = {id(e): e.env_reward - beta * kl[id(e)] for e in ok}
        mean = sum(scores.values()) / len(ok)
        for c in row:
            e = c.episode
            good = e is not None and e.turns and not e.failed
            want.append(scores[id(e)] - mean if good else 0.0)
    step.prepare(batch)
    assert batch.advantages.tolist() == pytest.approx(want, abs=1e-5)
