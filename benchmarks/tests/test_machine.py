from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from benchmarks.harness import machine
from benchmarks.harness.machine import PeakRss, bench_precision, matmul_peak_flops, tree_rss


def test_matmul_peak_arithmetic(monkeypatch):
    # every timed matmul "takes" 0.5 s: 2 * 4^3 FLOPs / 0.5 s = 256 FLOP/s
    ticks = iter(x * 0.5 for x in range(100))
    monkeypatch.setattr(machine.time, "perf_counter", lambda: next(ticks))
    assert matmul_peak_flops(n=4, threads=1, reps=3) == 256.0


def test_matmul_peak_rejects_unknown_dtype():
    with pytest.raises(ValueError, match="known: bfloat16, float32"):
        matmul_peak_flops(dtype="int8")


def test_bench_precision_follows_the_cpu_unless_forced():
    assert bench_precision("auto", bf16_fast=True)[0] == "bf16"
    # an AVX2-only CPU emulates bf16 matmuls: float32, what rlvr's model.autocast=auto picks
    precision, why = bench_precision("auto", bf16_fast=False)
    assert precision == "float32" and "no bf16 fast path" in why
    assert bench_precision("float32", bf16_fast=True) == ("float32", "forced by --precision")
    assert bench_precision("bf16", bf16_fast=False)[0] == "bf16"
    with pytest.raises(ValueError, match="--precision='fp16'"):
        bench_precision("fp16", bf16_fast=True)


def test_machine_info_records_instruction_set_caps(monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS", raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert machine.machine_info()["isa_limits"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert machine.machine_info()["isa_limits"] == {}


def test_tree_rss_counts_children():
    # a child that holds 200 MB of touched memory must show up in the parent's tree total
    code = "import sys,time; b = bytearray(200 * 2**20); print('ok', flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ok"
        own = psutil.Process().memory_info().rss
        total = tree_rss(os.getpid())
        assert total >= own + 190 * 2**20
        sampler = PeakRss(os.getpid(), interval_s=0.05).start()
        time.sleep(0.2)
        assert sampler.stop() >= own + 190 * 2**20
    finally:
        child.kill()
        child.wait()


def test_tree_rss_of_a_finished_process_is_zero():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert tree_rss(child.pid) == 0
