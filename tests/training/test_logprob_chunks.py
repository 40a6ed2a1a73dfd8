"""algo.logprob_chunk_tokens through a real training step: every objective's gradient is the
full-logits path's, and no [tokens, vocab] tensor larger than one chunk is made in the update,
the old-log-prob pass or the reference pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_train_e2e import one_float32_step
from torch.utils._python_dispatch import TorchDispatchMode

import rlvr.training.step as step_module
from rlvr.objectives import OBJECTIVES
from rlvr.training.tiny import save_tiny_model

# Each objective once, one optimizer step each (later steps would start from weights that
# differ by rounding); the first also takes the reference (KL in the loss), the old-log-prob
# pass (truncated IS weights need it), the entropy bonus's gradient and a sampling temperature.
# PPO's old-log-prob pass always runs.
CASES = [
    (
        "drgrpo",
        [
            "algo.beta=0.1",
            "algo.kl_mode=loss",
            "algo.tis_cap=2.0",
            "algo.entropy_coef=0.01",
            "rollout.temperature=0.7",
        ],
    ),
    ("grpo", []),
    ("rloo", []),
    ("ppo", []),
    ("maxent_listwise", []),
    ("gspo", ["algo.clip_low=3e-4", "algo.clip_high=4e-4"]),
    ("cispo", []),
    ("psgrpo_steps", ["algo.psgrpo.prm=toy_rewards:toy_prm", "algo.psgrpo.step_pattern='[a-z]'"]),
    ("prm_dense", ["algo.psgrpo.prm=toy_rewards:toy_prm", "algo.psgrpo.step_pattern='[a-z]'"]),
    ("gspo_token", []),  # the paper's clip comes with the objective
    # a teacher drawn from another seed: its log-probs differ from the student's, so the
    # per-token advantages (teacher - student) are not rounding noise
    ("distill", ["algo.teacher.name_or_path={teacher}"]),
]


def test_the_cases_cover_every_objective():
    assert sorted({name for name, _ in CASES}) == sorted(OBJECTIVES)


def teacher_dir(tmp_path: Path) -> Path:
    """A tiny model over the same char tokenizer as ``tiny_model_dir``'s, from another seed."""
    folder = tmp_path / "teacher"
    if not folder.exists():
        save_tiny_model(folder, seed=1)
    return folder


def gradients_at_each_optimizer_step(trainer) -> list[dict[str, torch.Tensor]]:
    """The gradient of every trainable tensor each time the optimizer steps (filled later)."""
    seen: list[dict[str, torch.Tensor]] = []
    opt = trainer.state.optimizer
    step = opt.step

    def recorded(*args, **kwargs):
        params = [p for g in opt.param_groups for p in g["params"]]
        seen.append({str(i): p.grad.clone() for i, p in enumerate(params) if p.grad is not None})
        return step(*args, **kwargs)

    opt.step = recorded
    return seen


@pytest.mark.parametrize("objective, extra", CASES)
def test_every_objective_s_gradient_equals_the_full_path(
    tiny_model_dir, tmp_path, objective, extra
):
    """One float32 step (same seed: same rollouts) with 3-token chunks and with the full
    logits: at every optimizer step the same gradients (to 1e-5 of each tensor's largest), the
    same loss and entropy metrics."""
    extra = [e.format(teacher=teacher_dir(tmp_path)) for e in extra]
    assert_chunks_step_as_the_full_path(
        tiny_model_dir, tmp_path, f"algo.objective={objective}", "rollout.max_new_tokens=8", *extra
    )


def assert_chunks_step_as_the_full_path(model_dir: Path, tmp_path: Path, *overrides: str) -> None:
    """One float32 step (same seed: same rollouts) with 3-token chunks and with the full
    logits: one optimizer step, the same gradients (to 1e-5 of each tensor's largest), the
    same loss and entropy metrics."""
    runs = {}
    for chunk in (3, 0):
        metrics, _, grads = one_float32_step(
            model_dir,
            tmp_path / f"c{chunk}",
            f"algo.logprob_chunk_tokens={chunk}",
            *overrides,
            before=gradients_at_each_optimizer_step,
        )
        runs[chunk] = metrics, grads
    (m3, g3), (m0, g0) = runs[3], runs[0]
    assert len(g3) == len(g0) == 1 and g0[0]
    for a, b in zip(g3, g0, strict=True):
        assert a.keys() == b.keys()
        for k in b:
            scale = b[k].abs().max().clamp(min=1e-12)
            assert float((a[k] - b[k]).abs().max() / scale) < 1e-5, (overrides, k)
    for key in ("policy_loss", "entropy_mean", "kl", "value_loss"):
        if key in m0:
            assert m3[key] == pytest.approx(m0[key], rel=1e-5, abs=1e-7), key


def save_tiny_family(folder: Path, family: str) -> Path:
    """A tiny Gemma-2 (final softcapping 0.5) or Granite (logits over 4) over the char
    tokenizer, its head scaled so the logits are several units: the transforms bite."""
    import transformers as tf

    from rlvr.training.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    small = dict(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
    )
    torch.manual_seed(0)
    if family == "gemma2":
        config = tf.Gemma2Config(
            final_logit_softcapping=0.5, head_dim=16, query_pre_attn_scalar=16, **small
        )
        model = tf.Gemma2ForCausalLM(config)
    else:
        model = tf.GraniteForCausalLM(tf.GraniteConfig(logits_scaling=4.0, **small))
    with torch.no_grad():
        model.get_output_embeddings().weight.normal_(0.0, 1.0)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("family", ["gemma2", "granite"])
def test_a_model_that_transforms_its_logits_steps_as_the_full_path(tmp_path, family):
    """A real training step (grpo, the entropy bonus, the old-log-prob pass for truncated IS,
    temperature 0.7) on a model whose forward transforms its head's output, through the head
    setup_run swaps in (lean_backward's linear): with 3-token chunks the same gradients and
    loss as with the full logits."""
    model_dir = save_tiny_family(tmp_path / family, family)
    assert_chunks_step_as_the_full_path(
        model_dir, tmp_path, "algo.tis_cap=2.0", "algo.entropy_coef=0.01", "rollout.temperature=0.7"
    )


class WidestVocabTensor(TorchDispatchMode):
    """The most rows of any new tensor an op makes whose last dimension is the vocabulary
    (views, such as the head's transposed weight, are not new memory)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.rows = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:
            return out
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-1] == self.vocab:
                self.rows = max(self.rows, t.numel() // self.vocab)
        return out


@pytest.mark.parametrize("chunk", [4, 0])
def test_no_tensor_wider_than_a_chunk_in_the_update_and_the_no_grad_passes(
    tiny_model_dir, tmp_path, monkeypatch, chunk
):
    """With 4-token chunks the update (forward, loss, backward), the old-log-prob pass and the
    reference pass make no [*, vocab] tensor of more than 4 rows. The full path (0), watched
    the same way, makes the [B, Tc, vocab] logits: the watch sees them."""
    watches: list[WidestVocabTensor] = []

    def wrap(trainer):
        vocab = trainer.run.model.get_output_embeddings().weight.shape[0]
        for owner, name in ((step_module, "update"), (step_module.Step, "logprobs")):
            fn = getattr(owner, name)

            def run(*args, _fn=fn, **kwargs):
                watch = WidestVocabTensor(vocab)
                watches.append(watch)
                with watch:
                    return _fn(*args, **kwargs)

            monkeypatch.setattr(owner, name, run)

    one_float32_step(
        tiny_model_dir,
        tmp_path / "run",
        f"algo.logprob_chunk_tokens={chunk}",
        "algo.beta=0.1",
        "algo.epochs_per_batch=2",
        "algo.entropy_coef=0.01",
        "rollout.max_new_tokens=8",
        before=wrap,
    )
    assert len(watches) == 2  # the no-grad passes, then the update
    widest = max(w.rows for w in watches)
    if chunk:
        assert 0 < widest <= chunk
    else:
        assert widest >= 8  # the logits of every token of the 8 replies at once
