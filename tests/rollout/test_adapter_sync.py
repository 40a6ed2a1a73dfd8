"""Adapter-only LoRA sync without vLLM (`rlvr.rollout.adapter_sync`): which runs get it, what the
engine starts from (the base weights, unmerged) and what one sync sends (the adapter, named as
peft saves it), checked against peft's own save."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from rlvr.config import load_config
from rlvr.rollout.adapter_sync import (
    AdapterFolder,
    adapter_tensors,
    max_lora_rank,
    sync_mode,
    without_adapters,
)
from rlvr.rollout.vllm_setup import checkpoint_weights
from rlvr.rollout.weight_sync import lora_merge_plan
from rlvr.training.tiny import build_char_tokenizer, build_tiny_model


def _peft(targets=("q_proj", "v_proj"), **kw):
    from peft import LoraConfig, get_peft_model

    base = build_tiny_model(build_char_tokenizer(), seed=0)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=list(targets), **kw))
    with torch.no_grad():  # a trained adapter: B != 0
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_()
    return base, model


def test_the_adapter_is_what_peft_saves_and_nothing_else(tmp_path):
    _, model = _peft()
    folder = AdapterFolder.create(model, "default")
    try:
        sent = adapter_tensors(model.state_dict().items(), "default", torch.float32)
        nbytes = folder.write(sent)
        model.save_pretrained(tmp_path / "peft")
        ref = load_file(tmp_path / "peft" / "adapter_model.safetensors")
        assert sorted(sent) == sorted(ref) and len(ref) == 8  # A, B of q, v in 2 layers
        assert all(torch.equal(sent[n], ref[n]) for n in ref)
        assert load_file(folder.path / "adapter_model.safetensors").keys() == ref.keys()
        # q: 64 -> 64, v: 64 -> 32 (one KV head of 32): 4 x (in + out) each, float32
        assert nbytes == 2 * 4 * ((64 + 64) + (64 + 32)) * 4
        assert (folder.path / "adapter_config.json").exists() and folder.rank == 4
    finally:
        folder.remove()
    assert not folder.path.exists()


def test_the_engine_starts_from_the_base_weights_not_the_merged_ones():
    _, model = _peft()
    base = build_tiny_model(build_char_tokenizer(), seed=0)  # peft wrapped the other in place
    names = dict(
        checkpoint_weights(
            without_adapters(model.state_dict().items()), {}, adapter="default", tied=True
        )
    )
    expected = {n: t for n, t in base.state_dict().items() if n != "lm_head.weight"}  # tied
    assert names.keys() == expected.keys()
    assert all(torch.equal(names[n], expected[n]) for n in expected)  # no B @ A added


def test_auto_takes_the_adapter_where_vllm_serves_it_and_merges_elsewhere():
    cfg = load_config(None, ["rollout.lora_sync=auto"])
    _, model = _peft()
    assert sync_mode(cfg, model, lora_merge_plan(model), "default") == "adapter"
    merged = load_config(None, ["rollout.lora_sync=merged"])
    assert sync_mode(merged, model, lora_merge_plan(model), "default") == "merged"
    _, saved = _peft(modules_to_save=["lm_head"])  # full modules beside the adapter
    assert sync_mode(cfg, saved, lora_merge_plan(saved), "default") == "merged"
    strict = load_config(None, ["rollout.lora_sync=adapter"])
    with pytest.raises(ValueError, match=r"rollout.lora_sync=adapter: .*modules_to_save"):
        sync_mode(strict, saved, lora_merge_plan(saved), "default")
    plain = build_tiny_model(build_char_tokenizer(), seed=0)
    assert sync_mode(cfg, plain, lora_merge_plan(plain), "default") == "full"


def test_vllm_ranks_and_the_server_command(tiny_model_dir):
    from rlvr.rollout.server_launch import server_command

    assert [max_lora_rank(r) for r in (1, 4, 8, 9, 16, 300, 512)] == [1, 8, 8, 16, 16, 320, 512]
    with pytest.raises(ValueError, match="above vLLM's largest"):
        max_lora_rank(513)
    lora = ["model.lora.enabled=true", "model.lora.rank=12", "model.autocast=off"]
    for sync, served in (("auto", True), ("adapter", True), ("merged", False)):
        cfg = load_config(None, [*lora, f"rollout.lora_sync={sync}"])
        cmd = server_command(cfg, tiny_model_dir, torch.float32, port=1)
        assert ("--enable-lora" in cmd) == served, sync
        if served:
            assert cmd[cmd.index("--max-lora-rank") + 1] == "16"
    assert "--enable-lora" not in server_command(
        load_config(None, []), tiny_model_dir, torch.float32, port=1
    )


def test_an_adapter_sync_that_cannot_happen_is_refused_naming_the_knobs():
    """rollout.lora_sync=adapter asks for something only a LoRA run with vLLM does: without
    model.lora.enabled, or with the hf engine (which samples from the trainer's own module and
    syncs nothing), the config check says so instead of ignoring the knob."""
    from rlvr.training.preflight.checks import config_problems

    def refusals(*overrides: str) -> list[str]:
        cfg = load_config(None, ["rollout.lora_sync=adapter", *overrides])
        return [p for p in config_problems(cfg) if "rollout.lora_sync=adapter" in p]

    (no_lora,) = refusals("rollout.mode=server")
    assert "model.lora.enabled" in no_lora
    (hf,) = refusals("model.lora.enabled=true", "rollout.engine=hf")
    assert "rollout.engine" in hf and "hf" in hf
    assert refusals("model.lora.enabled=true", "rollout.mode=server") == []
    assert refusals("model.lora.enabled=true", "rollout.engine=vllm") == []
    # auto and merged stay quiet wherever they fall back to what the run can do
    for sync in ("auto", "merged"):
        cfg = load_config(None, [f"rollout.lora_sync={sync}", "rollout.engine=hf"])
        assert not [p for p in config_problems(cfg) if "rollout.lora_sync" in p]
