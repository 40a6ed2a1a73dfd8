"""algo.objective=distill: on-policy distillation (arXiv 2306.13649) from a frozen teacher."""

from __future__ import annotations

import pytest
import torch
from tests.training.test_train_e2e import tiny_config

from rlvr.config import load_config
from rlvr.model.forward import sequence_logprobs
from rlvr.model.loading import load_model_and_tokenizer
from rlvr.objectives import build_objective
from rlvr.objectives.batch import RolloutBatch
from rlvr.rollout.base import Completion
from rlvr.training.preflight.checks import config_problems


def test_the_teacher_knob_is_named():
    cfg = load_config(None, ["algo.objective=distill"])
    assert config_problems(cfg) == [
        "algo.objective=distill needs algo.teacher.name_or_path (the teacher model: hub id or "
        "local folder, with the student's tokenizer)"
    ]


def _batch(tokenizer) -> RolloutBatch:
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in ("12", "345", "6", "78")]
    comps = [Completion(0, c, [0.0] * len(c), "", "stop") for c in ids]
    prompt = tokenizer.encode("3+4=", add_special_tokens=False)
    batch = RolloutBatch([{}, {}], ["3+4=", "3+4="], [prompt, prompt], [comps[:2], comps[2:]], 2)
    batch.scores = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    batch.valid = torch.ones(2, 2, dtype=torch.bool)
    batch.old_logp = [torch.full((len(c),), -1.5) for c in ids]
    return batch


@pytest.mark.parametrize("weight", [0.0, 2.0])
def test_advantage_is_teacher_minus_student_plus_the_weighted_reward(tiny_model_dir, weight):
    """Per token: the teacher's log-prob (computed here by its own forward) minus the student's
    old log-prob (-1.5 everywhere), plus weight x the Dr.GRPO advantage of the sequence: group 0
    scores [1, 0] -> [+0.5, -0.5], group 1 [0, 0] -> 0. The reverse-KL statistic is the mean of
    student - teacher over the 7 tokens."""
    cfg = load_config(
        None,
        [
            "algo.objective=distill",
            f"algo.teacher.name_or_path={tiny_model_dir}",
            f"algo.teacher.reward_weight={weight}",
        ],
    )
    model, tokenizer = load_model_and_tokenizer(str(tiny_model_dir))
    objective = build_objective(cfg, tokenizer)
    assert objective.attach(model, torch.device("cpu")) == []  # nothing for the optimizer
    batch = _batch(tokenizer)
    stats = objective.prepare(batch)
    sb = batch.sequence_batch(list(range(4)), tokenizer.pad_token_id)
    with torch.no_grad():
        teacher, _ = sequence_logprobs(model, sb)
    mix = [0.5, -0.5, 0.0, 0.0]
    for i, c in enumerate(batch.comp_ids):
        want = teacher[i, : len(c)] + 1.5 + weight * mix[i]
        assert torch.allclose(batch.advantages[i], want, atol=1e-5), i
    t = torch.cat([teacher[i, : len(c)] for i, c in enumerate(batch.comp_ids)])
    assert stats["distill_reverse_kl"] == pytest.approx(float((-1.5 - t).mean()), abs=1e-5)
    assert all(not p.requires_grad for p in objective.teacher.parameters())
    assert not objective.teacher.training


def test_a_teacher_with_another_tokenizer_is_refused(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    other = tmp_path / "other"
    model, tokenizer = load_model_and_tokenizer(str(tiny_model_dir))
    model.save_pretrained(other)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(other)
    cfg = load_config(None, ["algo.objective=distill", f"algo.teacher.name_or_path={other}"])
    objective = build_objective(cfg, tokenizer)
    with pytest.raises(ValueError, match="algo.teacher.name_or_path=.*tokenizer differs"):
        objective.attach(model, torch.device("cpu"))


@pytest.mark.parametrize("lora", [False, True])
def test_the_teacher_is_loaded_once_and_never_trained(tiny_model_dir, tmp_path, monkeypatch, lora):
    """Three steps in the loop (a LoRA student too): the teacher is loaded once, its weights end
    as the folder holds them while the student's moved, and the optimizer holds none of them."""
    import rlvr.objectives.distill as distill
    from rlvr.training.trainer import Trainer

    loads = []
    real = distill.load_model_and_tokenizer

    def counting(*args, **kw):
        loads.append(args[0])
        return real(*args, **kw)

    monkeypatch.setattr(distill, "load_model_and_tokenizer", counting)
    extra = ["model.lora.enabled=true", "model.lora.rank=4"] if lora else []
    cfg = tiny_config(
        tiny_model_dir,
        tmp_path,
        "algo.objective=distill",
        f"algo.teacher.name_or_path={tiny_model_dir}",
        "algo.prompts_per_step=2",
        "algo.group_size=4",
        "train.lr=1e-2",
        "eval.before_after=false",
        "logging.samples_every=0",
        *extra,
    )
    trainer = Trainer(cfg)
    teacher = trainer.run.objective.teacher
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    student_before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    kls = [trainer.train_step()["distill_reverse_kl"] for _ in range(3)]
    assert loads == [str(tiny_model_dir)]
    fresh, _ = load_model_and_tokenizer(str(tiny_model_dir))
    for k, v in teacher.state_dict().items():
        assert torch.equal(v, before[k]) and torch.equal(v, fresh.state_dict()[k]), k
    moved = [
        k for k, v in trainer.model.state_dict().items() if not torch.equal(v, student_before[k])
    ]
    assert moved and (not lora or all("lora_" in k for k in moved))
    ids = {id(p) for g in trainer.state.optimizer.param_groups for p in g["params"]}
    assert not ids & {id(p) for p in teacher.parameters()}
    # the teacher is the student's own starting point: the first step's reverse KL is 0
    assert kls[0] == pytest.approx(0.0, abs=1e-4)
    trainer.run.close()


def test_the_reverse_kl_to_a_sharp_teacher_falls_over_20_steps(tiny_model_dir, tmp_path):
    """A task where the student can learn it: the teacher is the tiny model trained to say
    "xyz" then EOS; the student, the untrained tiny model, says near-uniform characters (reverse
    KL ~4.6 nats a token at the start). Twenty steps of on-policy distillation (full weights,
    lr 1e-2) bring it below 60% of that: measured 4.58 -> 1.90 (train.seed 0), 4.58 -> 1.78
    (seed 1), 4.47 -> 1.36 (seed 2), means of the first 3 and last 5 steps. An advantage with the wrong
    sign or a teacher scoring other tokens than the student's would leave it at ~4.6 or raise
    it."""
    from rlvr.training.tiny import build_char_tokenizer, build_tiny_model
    from rlvr.training.trainer import Trainer

    tok = build_char_tokenizer()
    torch.manual_seed(1)
    teacher = build_tiny_model(tok, seed=0)
    opt = torch.optim.AdamW(teacher.parameters(), lr=1e-2)
    ids = torch.tensor([(tok("xyz", add_special_tokens=False).input_ids + [tok.eos_token_id]) * 6])
    for _ in range(30):
        teacher(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    teacher.save_pretrained(tmp_path / "teacher")
    tok.save_pretrained(tmp_path / "teacher")
    cfg = tiny_config(
        tiny_model_dir,
        tmp_path / "runs",
        "algo.objective=distill",
        f"algo.teacher.name_or_path={tmp_path / 'teacher'}",
        "algo.prompts_per_step=2",
        "algo.group_size=4",
        "train.lr=1e-2",
        "train.max_steps=20",
        "train.seed=0",
        "train.threads=1",
        "model.autocast=off",
        "eval.before_after=false",
        "logging.samples_every=0",
    )
    torch.manual_seed(0)
    trainer = Trainer(cfg)
    kls = [trainer.train_step()["distill_reverse_kl"] for _ in range(20)]
    trainer.run.close()
    first, last = sum(kls[:3]) / 3, sum(kls[-5:]) / 5
    assert first > 4.0  # the student starts far from the teacher
    assert last < 0.6 * first, kls
