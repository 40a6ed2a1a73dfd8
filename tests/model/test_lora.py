"""LoRA through peft: which layers get adapters, the adapters-off reference, an end-to-end LoRA run
whose checkpoint holds only the adapter, and `rlvr merge` reproducing the adapted model's logits."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.checkpoint.full import latest_checkpoint
from rlvr.cli.main import main as cli_main
from rlvr.config import ConfigError, load_config
from rlvr.config.lora import LoraConfig
from rlvr.model.lora import apply_lora
from rlvr.training.tiny import build_tiny_model
from rlvr.training.trainer import Trainer


@pytest.fixture
def tiny(tiny_tokenizer):
    # hidden 64, 2 heads -> head_dim 32; 1 KV head -> k_proj / v_proj map 64 -> 32
    return build_tiny_model(tiny_tokenizer, hidden=64, heads=2, kv_heads=1, intermediate=128)


def trainable(model) -> dict[str, int]:
    return {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}


def test_default_targets_are_the_attention_projections(tiny):
    model = apply_lora(tiny, LoraConfig(enabled=True, rank=4, alpha=8))
    names = trainable(model)
    assert {n.split(".")[-4] for n in names} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    # rank 4: A is [4, in], B is [out, 4].
    # q: 4*64 + 64*4 = 512; k, v: 4*64 + 32*4 = 384 each; o: 4*64 + 64*4 = 512 -> 1792 per layer,
    # 2 layers -> 3584 trainable numbers; nothing else trains.
    assert sum(names.values()) == 3584
    assert all(".lora_A." in n or ".lora_B." in n for n in names)


def test_all_linear_adapts_the_mlp_too_but_not_the_output_head(tiny):
    model = apply_lora(tiny, LoraConfig(enabled=True, rank=4, target_modules="all-linear"))
    layers = {n.split(".")[-4] for n in trainable(model)}
    assert layers == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_wrapping_and_loading_adapters_warn_of_nothing(tiny, tiny_tokenizer, tmp_path):
    """peft 0.21 reads the base model's ``is_gradient_checkpointing``, an alias transformers 5
    deprecates with a FutureWarning on every LoRA run; rlvr's own check reads
    ``is_activation_checkpointing``, and peft's own read is wrapped (rlvr.model.lora.peft_wrap)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = apply_lora(tiny, LoraConfig(enabled=True, rank=4))
    model.save_pretrained(tmp_path / "adapter")
    base = build_tiny_model(tiny_tokenizer, hidden=64, heads=2, kv_heads=1, intermediate=128)
    from peft import PeftModel

    from rlvr.model.lora import peft_wrap

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = peft_wrap(PeftModel.from_pretrained, base, str(tmp_path / "adapter"))
    assert any("lora_A" in n for n, _ in loaded.named_parameters())


def test_unknown_target_names_fail_with_the_known_ones(tiny):
    with pytest.raises(ValueError, match=r"\['qproj'\] match no linear layer.*'q_proj'"):
        apply_lora(tiny, LoraConfig(enabled=True, target_modules=["qproj", "v_proj"]))
    with pytest.raises(ConfigError, match="all-linear"):
        load_config(None, ["model.lora.target_modules=q_proj"])  # a bare string is not a list
    with pytest.raises(ConfigError, match="empty"):
        load_config(None, ["model.lora.target_modules=[]"])


def test_disabled_adapters_give_exactly_the_base_model(tiny):
    """The KL reference of a LoRA run is the same module with adapters off: no second copy."""
    base = copy.deepcopy(tiny).eval()
    model = apply_lora(tiny, LoraConfig(enabled=True, rank=4)).eval()
    torch.manual_seed(1)
    for name, p in model.named_parameters():
        if "lora_B" in name:  # B starts at zero; make the adapters actually change the output
            p.data.normal_(0, 0.5)
    ids = torch.tensor([[5, 17, 42, 9, 33, 8]])
    with torch.no_grad():
        want = base(input_ids=ids).logits
        adapted = model(input_ids=ids).logits
        with model.disable_adapter():
            reference = model(input_ids=ids).logits
    assert not torch.allclose(adapted, want, atol=1e-3)
    assert torch.equal(reference, want)


def test_lora_run_trains_only_adapters_saves_only_them_and_merges(tiny_model_dir, tmp_path):
    threads = torch.get_num_threads()
    cfg = load_config(
        None,
        [
            f"model.name_or_path={tiny_model_dir}",
            f"train.output_dir={tmp_path}",
            "train.run_name=lora",
            "data.template=none",
            "rollout.max_new_tokens=8",
            "logging.progress=false",
            "eval.before_after=false",
            "reward.specs=[{name: 'toy_rewards:count_sevens'}]",
            "train.max_steps=3",
            "train.save_every=3",
            "train.lr=1e-2",
            "algo.beta=0.1",
            "model.lora.enabled=true",
            "model.lora.rank=4",
            "model.lora.alpha=8",
            "train.threads=1",
        ],
    )
    trainer = Trainer(cfg)
    try:
        trainer.fit()
    finally:
        torch.set_num_threads(threads)
    run_dir = Path(trainer.run.run_dir)
    model = trainer.model

    # 1. base weights bitwise unchanged; adapter weights moved (B starts at zero)
    start = load_file(str(tiny_model_dir / "model.safetensors"))
    sd = model.get_base_model().state_dict()
    base_now = {k.replace(".base_layer", ""): v for k, v in sd.items() if "lora_" not in k}
    assert set(start) <= set(base_now)
    for key in start:
        assert torch.equal(start[key], base_now[key]), key
    lora_b = [v for k, v in sd.items() if "lora_B" in k]
    assert lora_b and all(v.abs().sum() > 0 for v in lora_b)

    # 2. the KL is measured against the base: zero at step 1 (B = 0), positive once B moved
    kl = [json.loads(line)["kl"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and kl[-1] > 0

    # 3. the checkpoint holds the adapter, not full weights
    ckpt = latest_checkpoint(run_dir)
    assert ckpt.step == 3
    files = {p.name for p in (ckpt.path / "model").iterdir()}
    assert "adapter_model.safetensors" in files and "model.safetensors" not in files
    adapter = load_file(str(ckpt.path / "model" / "adapter_model.safetensors"))
    assert adapter and all("lora_" in k for k in adapter)
    assert sum(v.numel() for v in adapter.values()) == 3584  # as counted in the first test

    # 4. `rlvr merge` writes a plain HF model whose logits equal the adapted model's
    out = tmp_path / "merged"
    assert cli_main(["merge", str(ckpt.path), "--out", str(out)]) == 0
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids = torch.tensor([[5, 17, 42, 9, 33, 8, 70, 71]])
    with torch.no_grad():
        want = model.eval()(input_ids=ids).logits
        got = merged(input_ids=ids).logits
        unadapted = base(input_ids=ids).logits
    # W + s*B@A vs W x + s*B(A x): the same maths in another order; float32 rounding only
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(unadapted, want, atol=1e-4)  # the adapters did change the model
    assert cli_main(["merge", str(ckpt.path), "--out", str(out)]) == 2  # never overwrites


def test_lora_matrices_are_drawn_from_train_seed_alone(tiny_model_dir, tmp_path):
    """torch's default generator starts from a random seed in every process: the adapters must
    not depend on it (two invocations, or two FSDP2 ranks each keeping a shard of its own draw,
    would otherwise start from different A matrices)."""

    def lora_a(seed: int, rng: int, name: str) -> dict[str, torch.Tensor]:
        cfg = load_config(
            None,
            [
                f"model.name_or_path={tiny_model_dir}",
                f"train.output_dir={tmp_path}",
                f"train.run_name={name}",
                "data.template=none",
                "model.lora.enabled=true",
                "model.lora.rank=4",
                f"train.seed={seed}",
            ],
        )
        torch.manual_seed(rng)  # whatever state the process happens to be in
        model = Trainer(cfg).model
        return {k: v.detach().clone() for k, v in model.named_parameters() if ".lora_A." in k}

    first, second = lora_a(0, 1, "a"), lora_a(0, 2, "b")
    assert first and all(torch.equal(first[k], second[k]) for k in first)
    other = lora_a(1, 1, "c")
    assert not torch.equal(first[next(iter(first))], other[next(iter(other))])
