"""The visual task end to end on the tiny VLM: every objective trains 3 steps on image prompts.

2 prompts x 2 samples, 4 new tokens. The reward is a checksum of the reply (tests/toy_rewards.py),
so groups differ and every step has a gradient. With the vision tower frozen (the default) its
weights must stay bitwise equal while the language model's move; with ``model.freeze=[]`` the
tower moves too.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("PIL.Image")

from rlvr.config import load_config  # noqa: E402
from rlvr.training.trainer import Trainer  # noqa: E402

VISION = "model.visual."
KEYS = ["reward_mean", "policy_loss", "grad_norm", "entropy_mean", "adv_std", "logprob_diff_max"]


def vlm_config(model_dir: Path, out: Path, *overrides: str):
    return load_config(
        None,
        [
            f"model.name_or_path={model_dir}",
            f"train.output_dir={out}",
            "data.task=shapes",
            "data.num_train=4",
            "data.num_eval=2",
            "algo.prompts_per_step=2",
            "algo.group_size=2",
            "rollout.max_new_tokens=4",
            "rollout.engine=hf",
            "reward.specs=[{name: 'toy_rewards:reply_checksum'}]",
            "train.lr=1e-2",
            "train.max_steps=3",
            "eval.before_after=false",
            "logging.progress=false",
            *overrides,
        ],
    )


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _moved(before: dict, after: dict, *, vision: bool) -> list[str]:
    return [
        n
        for n, p in before.items()
        if n.startswith(VISION) == vision and not torch.equal(p, after[n])
    ]


def _train(model_dir: Path, out: Path, *overrides: str) -> tuple[Trainer, list[dict], dict]:
    trainer = Trainer(vlm_config(model_dir, out, *overrides))
    before = _weights(trainer.model)
    summary = trainer.fit()
    run_dir = Path(summary["run_dir"])
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return trainer, [m for m in lines if "reward_mean" in m], before


def _check_metrics(lines: list[dict], objective: str) -> None:
    assert [m["step"] for m in lines] == [1, 2, 3]
    for m in lines:
        bad = {k: m.get(k) for k in KEYS if not math.isfinite(m.get(k, math.nan))}
        assert not bad, f"{objective}: missing or non-finite {bad}"
        assert m["nonfinite_skipped"] == 0.0
        # the sampler's and the trainer's log-probs of the same tokens agree: the log-prob pass
        # fed the images generation saw (another image would move them by far more)
        assert m["logprob_diff_max"] < 1e-2, m["logprob_diff_max"]


@pytest.mark.parametrize(
    "objective, extra",
    [
        ("drgrpo", []),
        ("grpo", ["algo.beta=0.05"]),  # a reference model's log-prob pass over the images too
        ("rloo", []),
        ("gspo", ["algo.clip_low=3e-4", "algo.clip_high=4e-4"]),
        ("cispo", []),
        ("maxent_listwise", []),
        ("ppo", []),  # the critic head sits on the language model's last hidden state
    ],
)
def test_vision_tower_frozen_by_default(tiny_vlm_dir, tmp_path, objective, extra):
    trainer, lines, before = _train(tiny_vlm_dir, tmp_path, f"algo.objective={objective}", *extra)
    _check_metrics(lines, objective)
    vision = sum(p.numel() for n, p in before.items() if n.startswith(VISION))
    total = sum(p.numel() for p in before.values())
    assert vision > 0
    assert all((m["params_trainable"], m["params_total"]) == (total - vision, total) for m in lines)
    after = _weights(trainer.model)
    assert _moved(before, after, vision=True) == []  # bitwise unchanged
    assert _moved(before, after, vision=False), "the language model did not train"


def test_whole_model_trains_with_freeze_off(tiny_vlm_dir, tmp_path):
    trainer, lines, before = _train(tiny_vlm_dir, tmp_path, "model.freeze=[]")
    _check_metrics(lines, "drgrpo")
    total = sum(p.numel() for p in before.values())
    assert all(m["params_trainable"] == m["params_total"] == total for m in lines)
    after = _weights(trainer.model)
    assert _moved(before, after, vision=True), "the vision tower did not train"
    assert _moved(before, after, vision=False)
    # the run's final folder loads with its processor (what `rlvr eval RUN` reads)
    from rlvr.model.vlm import load_policy_model

    final = Path(trainer.run.run_dir) / "final"
    model, _, processor = load_policy_model(str(final))
    assert processor is not None and processor.image_token_id == model.config.image_token_id
    assert all(torch.equal(p, after[n]) for n, p in model.named_parameters())


def test_image_rows_on_a_text_model_are_refused_before_training(tiny_model_dir, tmp_path):
    from rlvr.config import ConfigError

    with pytest.raises(ConfigError, match=r"train rows \(data.task=shapes\): rows carry images"):
        Trainer(vlm_config(tiny_model_dir, tmp_path))


def test_a_vlm_rolls_out_with_transformers(tiny_vlm_dir, tmp_path, monkeypatch):
    """auto picks hf for a VLM even where vLLM is installed; asking for vLLM is refused by name
    (its engine takes no image prompts: README, "Images next to the prompt")."""
    import rlvr.rollout.builder as run_setup
    from rlvr.config import ConfigError
    from rlvr.model.vlm import load_policy_model
    from rlvr.training.tiny import build_char_tokenizer, build_tiny_model

    monkeypatch.setattr(run_setup, "vllm_available", lambda: True)
    model, _, _ = load_policy_model(str(tiny_vlm_dir))
    cfg = vlm_config(tiny_vlm_dir, tmp_path, "rollout.engine=auto")
    assert run_setup.engine_for(cfg, model) == "hf"
    assert run_setup.engine_for(cfg, build_tiny_model(build_char_tokenizer())) == "vllm"
    with pytest.raises(ConfigError, match="rollout.engine=vllm: rlvr's vLLM engine does not take"):
        run_setup.engine_for(vlm_config(tiny_vlm_dir, tmp_path, "rollout.engine=vllm"), model)


@pytest.mark.parametrize(
    "knobs, message",
    [
        (
            ["rollout.mode=server", "rollout.engine=vllm"],
            "rollout.mode=server: rlvr's vLLM engine does not take",
        ),
        (["rollout.max_staleness=1"], "not yet the rows. own images"),
    ],
)
def test_rollouts_that_drop_images_are_refused_for_a_vlm(tiny_vlm_dir, tmp_path, knobs, message):
    """The rollout server (vLLM) and the batch generated ahead (checkpointed as JSON) carry no
    images: a VLM with either is refused by name before the first step, not mid-run."""
    from rlvr.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        Trainer(vlm_config(tiny_vlm_dir, tmp_path, *knobs))


def test_lora_on_a_vlm_leaves_the_frozen_tower_without_adapters(tiny_vlm_dir, tmp_path):
    """LoRA on every linear layer but the frozen tower's; the reference (adapters off) is scored
    over the same images (algo.beta > 0)."""
    trainer, lines, _ = _train(
        tiny_vlm_dir,
        tmp_path,
        "model.lora.enabled=true",
        "model.lora.target_modules=all-linear",
        "algo.beta=0.05",
    )
    _check_metrics(lines, "drgrpo (LoRA)")
    assert all(math.isfinite(m["kl"]) for m in lines)
    adapters = {n: p for n, p in trainer.model.named_parameters() if "lora_" in n}
    assert adapters and not [n for n in adapters if ".visual." in n]
    assert lines[0]["params_trainable"] == sum(p.numel() for p in adapters.values())
    assert any(float(p.detach().abs().max()) > 0 for n, p in adapters.items() if "lora_B" in n)
