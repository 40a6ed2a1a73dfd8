"""Each phase's physical bound: the arithmetic by hand, and the report's rows."""

from __future__ import annotations

import pytest

from benchmarks.harness import machine
from benchmarks.harness.bounds import bound_summary, decode_bytes, phase_bounds
from benchmarks.harness.machine import memory_bandwidth
from benchmarks.harness.model_info import kv_bytes_per_token
from benchmarks.harness.report import render_markdown
from benchmarks.tests.test_report import _cells, _payload

INFO = {"total_params": 110, "nonembed_params": 100, "head_params": 10, "kv_bytes_per_token": 10}
# one step: two sequences with prompts of 2 and 3 tokens and replies of 1 and 2
REC = {
    "prompt_tokens": 5,
    "completion_tokens": 3,
    "seq_prompt_lens": [2, 3],
    "completion_lens": [1, 2],
}


def test_decode_bytes_by_hand():
    # weights 100, 10 bytes per cached token, prompts [2, 3], replies [1, 2]:
    # step 1 reads 100 + 10 * (2 + 3) = 150; step 2 only the second sequence: 100 + 10 * (3 + 1)
    assert decode_bytes(100, 10, [2, 3], [1, 2]) == 290
    # a finished sequence's cache is no longer read; no replies, nothing decoded
    assert decode_bytes(100, 10, [2, 3], [0, 0]) == 0
    with pytest.raises(ValueError, match="one prompt length per sequence"):
        decode_bytes(100, 10, [2], [1, 2])


def test_phase_bounds_by_hand():
    b = phase_bounds(REC, {**INFO, "engine": "vllm"}, peak_flops=1000.0, bandwidth=10.0)
    # update: 6 * (100 * 8 + 10 * 3) = 4980 FLOPs at 1000 FLOP/s
    assert b["update"] == pytest.approx(4.98)
    # generation: bf16 weights of body + head = 2 * 110 = 220 bytes per decoding step;
    # step 1: 220 + 10 * 5 = 270, step 2: 220 + 10 * 4 = 260 -> 530 bytes at 10 B/s
    assert b["generate"] == pytest.approx(53.0)
    # sync into vLLM's own copy: 220 bytes read and 220 written; the transformers engine has none
    assert b["sync"] == pytest.approx(44.0)
    assert "sync" not in phase_bounds(REC, {**INFO, "engine": "hf"}, 1000.0, 10.0)
    # without per-sequence lengths (an old results file) there is no generation bound
    assert "generate" not in phase_bounds(
        {"prompt_tokens": 5, "completion_tokens": 3}, INFO, 1000.0, 10.0
    )
    with pytest.raises(ValueError, match="must be > 0"):
        phase_bounds(REC, INFO, peak_flops=0.0, bandwidth=10.0)


def test_phase_bounds_in_float32_read_four_bytes_per_value():
    b = phase_bounds(REC, {**INFO, "engine": "vllm"}, 1000.0, 10.0, dtype_bytes=4)
    # FLOPs do not depend on the precision (its peak does): still 4980 at 1000 FLOP/s
    assert b["update"] == pytest.approx(4.98)
    # float32 weights 4 * 110 = 440 per decoding step; the KV cache doubles from 10 to 20 bytes
    # per token: step 1: 440 + 20 * 5 = 540, step 2: 440 + 20 * 4 = 520 -> 1060 bytes at 10 B/s
    assert b["generate"] == pytest.approx(106.0)
    assert b["sync"] == pytest.approx(88.0)  # 440 bytes read, 440 written
    steps = [{**REC, "phases": {"generate": 212.0, "update": 9.96, "sync": 88.0}}]
    out = bound_summary(steps, {**INFO, "engine": "vllm"}, 1000.0, 10.0, dtype_bytes=4)
    assert out["phase_at_bound"] == pytest.approx({"generate": 0.5, "update": 0.5, "sync": 1.0})


def test_bound_summary_weighs_steps_by_time_and_skips_idle_phases():
    steps = [
        {**REC, "phases": {"generate": 106.0, "update": 4.98, "sync": 0.0}},
        {**REC, "phases": {"generate": 53.0, "update": 9.96, "sync": 0.0}},
    ]
    out = bound_summary(steps, {**INFO, "engine": "vllm"}, peak_flops=1000.0, bandwidth=10.0)
    # generation: 2 x 53 s of bound over 159 s spent = 2/3; update: 9.96 / 14.94 = 2/3
    assert out["phase_at_bound"]["generate"] == pytest.approx(2 / 3)
    assert out["phase_at_bound"]["update"] == pytest.approx(2 / 3)
    assert out["phase_bound_s"]["generate"] == pytest.approx(53.0)
    # a phase with no time spent has no share to show
    assert "sync" not in out["phase_at_bound"]


def test_kv_bytes_per_token_from_a_config():
    class Cfg:  # SmolLM2-135M's shape: 30 layers, 9 heads of 64, 3 KV heads
        num_hidden_layers, num_attention_heads, num_key_value_heads = 30, 9, 3
        hidden_size = 576

    assert kv_bytes_per_token(Cfg()) == 2 * 30 * 3 * 64 * 2 == 23040


def test_memory_bandwidth_arithmetic(monkeypatch):
    # every timed copy "takes" 0.5 s: one 1 MiB copy reads and writes 2 MiB -> 4 MiB/s
    ticks = iter(x * 0.5 for x in range(100))
    monkeypatch.setattr(machine.time, "perf_counter", lambda: next(ticks))
    assert memory_bandwidth(mib=1, threads=1, reps=3) == 4 * 2**20


def test_report_rows_against_the_bound():
    payload = _payload()
    payload["memory_bandwidth_gbs"] = 7.5
    payload["sides"]["rlvr"]["summary"]["phase_at_bound"] = {"generate": 0.2, "update": 0.5}
    payload["sides"]["trl"]["summary"]["phase_at_bound"] = {"generate": 0.1, "update": 0.25}
    md = render_markdown(payload)
    gen = next(r for r in md.splitlines() if r.startswith("| - generation (weights"))
    assert [c.strip() for c in gen.strip("|").split("|")][1:] == ["20.0", "10.0", "2.00"]
    upd = "- update (6 FLOPs per parameter per token / matmul peak), % of bound"
    assert _cells(md, upd)[1:] == ["50.0", "25.0", "2.00"]
    assert "memory bandwidth (256 MiB copy): 7.5 GB/s" in md
