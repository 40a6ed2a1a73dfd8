"""rollout.max_staleness=1: step t+1's batch comes from the policy before update t, every
completion carries the version that sampled it, and algo.tis_cap corrects the loss per token."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch
from test_train_e2e import read_lines, tiny_config

from rlvr.config import load_config
from rlvr.training.trainer import Trainer

COMMON = (
    "model.autocast=off",
    "train.threads=1",
    "train.max_grad_norm=1000",
    "eval.before_after=false",
    "algo.prompts_per_step=2",
    "algo.group_size=4",
    "reward.specs=[{name: 'toy_rewards:digit_fraction'}]",  # rewards differ in every group
)


def _completion_logp(model, prompt: list[int], comp: list[int]) -> torch.Tensor:
    """log pi(comp_t | prompt, comp_<t) at temperature 1, one sequence, no padding."""
    ids = torch.tensor([prompt + comp])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) + len(comp) - 1]
    return torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(comp)[:, None])[:, 0]


def test_stale_batch_loss_and_gradient_equal_the_hand_computed_correction(tiny_model_dir, tmp_path):
    """Step 2 trains version 1 on a batch sampled by version 0. By hand, over the batch's tokens:
    w_t = min(pi_1 / pi_0, cap) from the two weight snapshots, A_i = r_i - mean of its group
    (Dr. GRPO), loss = -sum_i,t w_t A_i ratio_t / tokens with ratio = 1 at the first pass, so
    the gradient is -sum w_t A_i grad log pi_1 / tokens. The trainer's loss and the gradient the
    optimizer steps with must equal those."""
    cap = 1.02
    cfg = tiny_config(
        tiny_model_dir,
        tmp_path,
        *COMMON,
        "rollout.max_staleness=1",
        f"algo.tis_cap={cap}",
        "algo.loss_agg=token_mean",
        "train.lr=3e-3",
        "train.max_steps=2",
    )
    torch.manual_seed(0)
    trainer = Trainer(cfg)
    v0 = copy.deepcopy(trainer.model).eval()
    m1 = trainer.train_step()
    trainer.state.step += 1
    v1 = copy.deepcopy(trainer.model).eval()
    grads: list[torch.Tensor] = []
    params = list(trainer.state.trainable_params())

    def capture(opt, args, kwargs):
        grads[:] = [p.grad.detach().clone() for p in params]

    trainer.state.optimizer.register_step_pre_hook(capture)
    m2 = trainer.train_step()
    batch = trainer.last_batch
    trainer.run.close()

    assert (m1["staleness_mean"], m1["staleness_max"]) == (0.0, 0.0)
    assert (m2["staleness_mean"], m2["staleness_max"]) == (1.0, 1.0)
    assert {c.policy_version for c in batch.completions} == {0}

    names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    hand = dict(v1.named_parameters())
    for p in hand.values():
        p.requires_grad_(True)
    loss_terms, tokens, cut = [], 0, 0
    adv = batch.scores - batch.scores.mean(1, keepdim=True)
    for i, c in enumerate(batch.completions):
        prompt = batch.seq_prompt_ids[i]
        with torch.no_grad():
            lp0 = _completion_logp(v0, prompt, c.token_ids)
        # the premise: version 0 sampled it (the engine's log-probs are version 0's)
        assert torch.tensor(c.logprobs) == pytest.approx(lp0, abs=1e-5)
        lp1 = _completion_logp(v1, prompt, c.token_ids)
        w = torch.clamp(torch.exp(lp1.detach() - lp0), max=cap)
        cut += int((torch.exp(lp1.detach() - lp0) > cap).sum())
        ratio = torch.exp(lp1 - lp1.detach())
        loss_terms.append((-adv.view(-1)[i] * w * ratio).sum())
        tokens += len(c.token_ids)
    loss = torch.stack(loss_terms).sum() / tokens
    loss.backward()
    assert 0 < cut < tokens  # the cap binds on some tokens, not all
    assert m2["policy_loss"] == pytest.approx(float(loss.detach()), rel=1e-5, abs=1e-7)
    assert m2["tis_truncated_frac"] == pytest.approx(cut / tokens)
    assert len(grads) == len(names)
    for name, g in zip(names, grads, strict=True):
        torch.testing.assert_close(g, hand[name].grad, rtol=1e-4, atol=1e-7, msg=name)


def test_staleness_one_run_logs_versions_and_resumes_exactly(tiny_model_dir, tmp_path):
    """3 steps with staleness 1: staleness 0 at step 1, 1 from step 2 on; the engine log-probs
    of a stale batch differ from the trainer's (they are the previous version's). A run stopped
    after step 2's checkpoint and resumed trains step 3 on the batch generated before the stop
    and ends with the same weights and metrics as the uninterrupted run."""

    torch.manual_seed(0)
    cfg = tiny_config(
        tiny_model_dir,
        tmp_path / "full",
        *COMMON,
        "rollout.max_staleness=1",
        "algo.tis_cap=2",
        "train.lr=3e-3",
        "train.save_every=1",
    )
    full = Trainer(cfg)
    full.fit()
    lines = [m for m in read_lines(full.run.run_dir) if m["step"] > 0]
    assert [m["staleness_max"] for m in lines] == [0.0, 1.0, 1.0]
    assert lines[0]["logprob_diff_max"] < 1e-4  # on-policy: the hf engine is the trainer
    assert all(m["logprob_diff_max"] > 1e-3 for m in lines[1:])  # one version behind

    part = tmp_path / "part"
    shutil.copytree(full.run.run_dir, part)
    shutil.rmtree(part / "checkpoints" / "step_000003")
    shutil.rmtree(part / "final")
    saved = json.loads((part / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    [ahead] = saved["extra"]["lookahead"]["batches"]
    assert ahead["step"] == 2 and len(ahead["groups"]) == 2  # step 3's batch (0-based 2)
    assert {c["policy_version"] for g in ahead["groups"] for c in g} == {1}
    resumed = Trainer(load_config(part / "config.yaml", [f"train.resume={part}"]))
    resumed.fit()
    again = [m for m in read_lines(part) if m["step"] > 0]
    again = [m for m in read_lines(resumed.run.run_dir) if m["step"] > 0]
    keys = ("reward_mean", "policy_loss", "grad_norm", "staleness_max", "tis_weight_mean")
    assert [[m[k] for k in keys] for m in again] == [[m[k] for k in keys] for m in lines]
    for (n, a), (_, b) in zip(
        full.model.state_dict().items(), resumed.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), n


def test_the_transformers_engine_is_never_stale_whatever_sync_every(tiny_model_dir, tmp_path):
    """The hf engine samples from the trainer's own module, so its completions come from the
    current policy even when rollout.sync_every skips syncs: staleness must read 0 on every step
    (a metric that reports lag that is not there sends users chasing a bug that does not exist).
    With max_staleness=1 the lag is real and reads 1 from step 2 on."""
    cfg = tiny_config(tiny_model_dir, tmp_path / "a", *COMMON, "rollout.sync_every=3")
    trainer = Trainer(cfg)
    trainer.fit()
    lines = [m for m in read_lines(trainer.run.run_dir) if m["step"] > 0]
    assert [m["staleness_max"] for m in lines] == [0.0, 0.0, 0.0]
    assert all(m["logprob_diff_max"] < 1e-4 for m in lines)  # the same weights, truly
    cfg = tiny_config(
        tiny_model_dir, tmp_path / "b", *COMMON, "rollout.sync_every=3", "rollout.max_staleness=1"
    )
    trainer = Trainer(cfg)
    trainer.fit()
    lines = [m for m in read_lines(trainer.run.run_dir) if m["step"] > 0]
    assert [m["staleness_max"] for m in lines] == [0.0, 1.0, 1.0]
