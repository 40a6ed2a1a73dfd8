"""Weight-sync conversions without an engine: LoRA merge, name mapping, buckets, KV budget.

These need torch and peft only, so they also run where vLLM is not installed.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_support import LORA_TARGETS, TINY, base_model, engine_config, peft_model

from rlvr.rollout.vllm_setup import (
    checkpoint_weights,
    cpu_kv_cache_bytes,
    engine_dtype,
    export_checkpoint,
    kv_bytes_per_token,
    max_model_len_for,
)
from rlvr.rollout.weight_sync import (
    LoraMerge,
    SyncStats,
    block_key,
    lora_merge_plan,
    merged_named_weights,
    weight_buckets,
)


# ---------------------------------------------------------------------- LoRA merge by hand
def test_merge_of_one_linear_by_hand():
    # W = [[1, 0], [0, 1]], A = [[1, 2]] (r=1, in=2), B = [[3], [4]] (out=2, r=1), scaling 0.5:
    # B @ A = [[3, 6], [4, 8]]; W + 0.5 * B @ A = [[2.5, 3], [2, 5]]
    named = [
        ("base_model.model.proj.base_layer.weight", torch.eye(2)),
        ("base_model.model.proj.base_layer.bias", torch.tensor([7.0, 8.0])),
        ("base_model.model.proj.lora_A.default.weight", torch.tensor([[1.0, 2.0]])),
        ("base_model.model.proj.lora_B.default.weight", torch.tensor([[3.0], [4.0]])),
        ("base_model.model.norm.weight", torch.ones(2)),
    ]
    stats = SyncStats()
    plan = {"base_model.model.proj": LoraMerge(scaling=0.5)}
    out = dict(merged_named_weights(named, plan, stats=stats))
    assert stats.lora_merged == 1
    assert list(out) == ["proj.bias", "proj.weight", "norm.weight"]
    assert torch.equal(out["proj.weight"], torch.tensor([[2.5, 3.0], [2.0, 5.0]]))
    assert torch.equal(out["proj.bias"], torch.tensor([7.0, 8.0]))


def test_merge_of_an_embedding_by_hand():
    # peft Embedding: A is [r, num_embeddings] = [[1, 2, 3]], B is [dim, r] = [[1], [-1]];
    # delta = (B @ A).T * 2 = [[1, 2, 3], [-1, -2, -3]].T * 2 = [[2, -2], [4, -4], [6, -6]]
    named = [
        ("base_model.model.emb.base_layer.weight", torch.zeros(3, 2)),
        ("base_model.model.emb.lora_embedding_A.default", torch.tensor([[1.0, 2.0, 3.0]])),
        ("base_model.model.emb.lora_embedding_B.default", torch.tensor([[1.0], [-1.0]])),
    ]
    plan = {"base_model.model.emb": LoraMerge(scaling=2.0, embedding=True)}
    out = dict(merged_named_weights(named, plan))
    assert torch.equal(out["emb.weight"], torch.tensor([[2.0, -2.0], [4.0, -4.0], [6.0, -6.0]]))


def test_merge_keeps_base_dtype_and_drops_other_adapters():
    named = [
        ("base_model.model.p.base_layer.weight", torch.zeros(2, 2, dtype=torch.bfloat16)),
        ("base_model.model.p.lora_A.other.weight", torch.ones(1, 2)),
        ("base_model.model.p.lora_A.default.weight", torch.ones(1, 2)),
        ("base_model.model.p.lora_B.other.weight", torch.ones(2, 1)),
        ("base_model.model.p.lora_B.default.weight", torch.ones(2, 1)),
    ]
    out = dict(merged_named_weights(named, {"base_model.model.p": LoraMerge(scaling=1.0)}))
    assert out["p.weight"].dtype == torch.bfloat16
    assert torch.equal(out["p.weight"].float(), torch.ones(2, 2))  # B @ A = ones, counted once


def test_modules_to_save_replace_the_original():
    named = [
        ("base_model.model.head.original_module.weight", torch.zeros(2)),
        ("base_model.model.head.modules_to_save.default.weight", torch.ones(2)),
    ]
    assert [(n, t.tolist()) for n, t in merged_named_weights(named, {})] == [
        ("head.weight", [1.0, 1.0])
    ]


def test_merge_errors_name_the_problem():
    lora_a = ("base_model.model.p.lora_A.default.weight", torch.ones(1, 2))
    with pytest.raises(ValueError, match="without a known scaling"):
        list(merged_named_weights([lora_a], {}))
    plan = {"base_model.model.p": LoraMerge(scaling=1.0)}
    with pytest.raises(ValueError, match=r"'base_model.model.p': \['B', 'W'\]"):
        list(merged_named_weights([lora_a], plan))
    dora = ("base_model.model.p.lora_magnitude_vector.default.weight", torch.ones(2))
    with pytest.raises(ValueError, match="DoRA"):
        list(merged_named_weights([dora], plan))
    bias = ("base_model.model.p.lora_B.default.bias", torch.ones(2))
    with pytest.raises(ValueError, match="only LoRA weights"):
        list(merged_named_weights([bias], plan))


def test_peft_state_dict_merges_to_the_merged_model(tok):
    """Against peft's own merge: merge_and_unload() of a perturbed adapter gives the same tensors."""
    peft = peft_model(tok)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    plan = lora_merge_plan(peft)
    # alpha / r = 8 / 4 = 2 for each of 7 targets in each of the 2 blocks
    assert len(plan) == 2 * len(LORA_TARGETS)
    assert {m.scaling for m in plan.values()} == {2.0}
    ours = dict(checkpoint_weights(peft.state_dict().items(), plan, adapter="default", tied=True))
    reference = peft.merge_and_unload().state_dict()
    assert set(ours) == set(reference) - {"lm_head.weight"}  # tied: the embedding serves both
    for name, t in ours.items():
        torch.testing.assert_close(t, reference[name], rtol=0, atol=1e-6)


def test_plain_state_dict_passes_through(tok):
    model = base_model(tok)
    sd = model.state_dict()
    out = list(checkpoint_weights(sd.items(), {}, adapter="default", tied=False))
    assert [n for n, _ in out] == list(sd)
    assert all(t is sd[n] for n, t in out)


# ---------------------------------------------------------------------- buckets
def test_block_key():
    assert block_key("model.layers.12.mlp.up_proj.weight") == "model.layers.12."
    assert block_key("model.embed_tokens.weight") == "model.embed_tokens.weight"


@settings(max_examples=60, deadline=None)
@given(
    blocks=st.lists(st.lists(st.integers(1, 50), min_size=1, max_size=4), min_size=1, max_size=8),
    bucket_bytes=st.integers(1, 600),
)
def test_buckets_hold_whole_blocks_in_order(blocks, bucket_bytes):
    """Property: every tensor once, in order, no block split, a bucket closes once it is full."""
    named = [
        (f"model.layers.{b}.t{j}.weight", torch.zeros(n))  # float32: 4 bytes per element
        for b, sizes in enumerate(blocks)
        for j, n in enumerate(sizes)
    ]
    buckets = list(weight_buckets(named, bucket_bytes))
    assert [n for bucket in buckets for n, _ in bucket] == [n for n, _ in named]
    seen_blocks = [{block_key(n) for n, _ in bucket} for bucket in buckets]
    for i, a in enumerate(seen_blocks):
        for b in seen_blocks[i + 1 :]:
            assert not a & b  # no block in two buckets
    for bucket in buckets[:-1]:
        size = sum(4 * t.numel() for _, t in bucket)
        last_block = [n for n, _ in bucket if block_key(n) == block_key(bucket[-1][0])]
        size_without_last = size - sum(4 * dict(named)[n].numel() for n in last_block)
        assert size >= bucket_bytes > size_without_last  # closed right after it filled up


def test_buckets_cast_and_detach():
    w = torch.ones(3, requires_grad=True)
    ids = torch.tensor([1, 2])
    (bucket,) = weight_buckets([("a.weight", w), ("a.ids", ids)], 1 << 20, dtype=torch.bfloat16)
    assert bucket[0][1].dtype == torch.bfloat16 and not bucket[0][1].requires_grad
    assert bucket[1][1].dtype == torch.long  # integer buffers keep their dtype


def test_non_contiguous_block_is_an_error():
    named = [(f"model.layers.{i}.w", torch.zeros(1)) for i in (0, 1, 0)]
    with pytest.raises(ValueError, match="not contiguous"):
        list(weight_buckets(named, 1))
    with pytest.raises(ValueError, match="bucket_bytes"):
        list(weight_buckets(named, 0))


# ---------------------------------------------------------------------- engine set-up helpers
def test_kv_budget_by_hand(tok):
    config = base_model(tok).config
    # 2 layers x (K and V) x 1 KV head x head_dim 64 x 2 bytes (bf16) = 512 bytes per token
    assert kv_bytes_per_token(config, torch.bfloat16) == 512
    # 8 sequences x two 32-token blocks (48 tokens round up to 64) x 512 bytes = 262144 bytes,
    # under the cap of 0.1 x 10 MiB = 1048576 bytes
    kw = dict(max_model_len=48, max_num_seqs=8, total_memory=10 * 2**20)
    assert cpu_kv_cache_bytes(config, torch.bfloat16, memory_fraction=0.1, **kw) == 262144
    # 200 tokens take 7 blocks: 8 x 224 x 512 = 917504 bytes; 256 take 8: 1048576, at the cap
    long = {**kw, "max_model_len": 200}
    assert cpu_kv_cache_bytes(config, torch.bfloat16, memory_fraction=0.1, **long) == 917504
    at_cap = {**kw, "max_model_len": 256}
    assert cpu_kv_cache_bytes(config, torch.bfloat16, memory_fraction=0.1, **at_cap) == 1048576
    # a cap of 0.02 x 10 MiB = int(209715.2) bytes binds
    assert cpu_kv_cache_bytes(config, torch.bfloat16, memory_fraction=0.02, **kw) == 209715
    # 1e-6 x 10 MiB = 10 bytes: less than one sequence's 64 x 512 = 32768 bytes
    with pytest.raises(ValueError, match="gpu_memory_utilization=1e-06"):
        cpu_kv_cache_bytes(config, torch.bfloat16, memory_fraction=1e-6, **kw)


def test_engine_dtype_follows_trainer_numerics(monkeypatch):
    import rlvr.rollout.vllm_setup as vllm_setup
    from rlvr.config import load_config

    monkeypatch.setattr(vllm_setup, "bf16_supported", lambda device="cpu": True)
    assert engine_dtype(engine_config(), "cpu") == torch.float32  # autocast off, float32 weights
    assert engine_dtype(load_config(None, []), "cpu") == torch.bfloat16  # autocast auto
    assert engine_dtype(load_config(None, ["model.dtype=bfloat16"]), "cpu") == torch.bfloat16
    monkeypatch.setattr(vllm_setup, "bf16_supported", lambda device="cpu": False)
    assert engine_dtype(load_config(None, []), "cpu") == torch.float32


def test_max_model_len_covers_rollouts_and_evals():
    from rlvr.config import load_config

    assert max_model_len_for(engine_config()) == 32 + 16
    cfg = load_config(None, ["data.max_prompt_tokens=32", "eval.max_new_tokens=100"])
    assert max_model_len_for(cfg) == 32 + 100


def test_export_writes_a_loadable_checkpoint(tok, tmp_path):
    from transformers import AutoModelForCausalLM

    model = base_model(tok)
    weights = checkpoint_weights(model.state_dict().items(), {}, adapter="default", tied=True)
    # shard_bytes=1: one file per unit (embedding, each decoder block, final norm), each written
    # as the stream reaches it (the export never holds the whole model)
    names = export_checkpoint(tmp_path, model, tok, weights, torch.bfloat16, shard_bytes=1)
    assert "lm_head.weight" not in names and len(names) == 20
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert sorted(index["weight_map"]) == sorted(names)
    assert len(list(tmp_path.glob("model-*.safetensors"))) == 2 + TINY["layers"]
    assert index["weight_map"]["model.layers.1.mlp.up_proj.weight"] == "model-00003.safetensors"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    for name, t in model.state_dict().items():  # bf16 round trip: relative error <= 2^-8
        torch.testing.assert_close(loaded.state_dict()[name], t, rtol=2**-8, atol=0)
    assert math.prod(loaded.lm_head.weight.shape) == len(tok) * TINY["hidden"]


def test_lora_on_tied_embedding_is_refused_before_start(tok):
    from peft import LoraConfig, get_peft_model

    from rlvr.rollout.vllm import VLLMEngine

    peft = get_peft_model(base_model(tok), LoraConfig(r=2, target_modules=["embed_tokens"]))
    with pytest.raises(ValueError, match="tied embedding"):
        VLLMEngine.from_trainer(engine_config(), peft, tok)
