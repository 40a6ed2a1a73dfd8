"""model.autocast=auto picks the fast precision of the machine and the run says which."""

from __future__ import annotations

import pytest
from tests.training.test_train_e2e import tiny_config

from rlvr.model import precision
from rlvr.training.trainer import Trainer


@pytest.mark.parametrize("fast_bf16, expected", [(True, "bf16 autocast"), (False, "float32")])
def test_auto_precision_follows_the_cpu_and_is_printed(
    tiny_model_dir, tmp_path, monkeypatch, capsys, fast_bf16, expected
):
    # an AVX2-only CPU (no bf16 fast path) must train in float32, an AVX512-BF16 one in bf16
    monkeypatch.setattr(precision, "bf16_supported", lambda device: fast_bf16)
    cfg = tiny_config(tiny_model_dir, tmp_path, "model.autocast=auto", "train.max_steps=1")
    trainer = Trainer(cfg)
    assert trainer.run.autocast is fast_bf16
    summary = trainer.fit()
    has = "has a" if fast_bf16 else "has no"
    line = f"[rlvr] precision: {expected} (model.autocast=auto: this CPU {has} bf16 fast path)"
    assert line in capsys.readouterr().out
    assert summary["precision"] == line.removeprefix("[rlvr] precision: ")


def test_an_explicit_choice_is_named_as_such(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "bf16_supported", lambda device: True)
    cfg = tiny_config(tiny_model_dir, tmp_path, "model.autocast=off", "train.max_steps=1")
    assert Trainer(cfg).fit()["precision"] == "float32 (model.autocast=off)"


@pytest.mark.parametrize(
    "cap, allowed",
    [
        ("", True),
        ("AVX2", False),
        ("avx512_core", False),
        ("AVX512_CORE_BF16", True),
        ("ALL", True),
    ],
)
def test_bf16_is_fast_only_where_onednn_may_use_it(monkeypatch, cap, allowed):
    # a CPU with AVX512-BF16 whose oneDNN is capped below it (ONEDNN_MAX_CPU_ISA=AVX2, as when
    # emulating an AVX2-only machine) emulates bf16 matmuls: auto must pick float32 there
    class CpuInfo:
        def __init__(self, path):
            self.path = path

        def read_text(self):
            assert self.path == "/proc/cpuinfo"
            return "flags\t\t: fpu avx2 avx512f avx512_bf16\n"

    monkeypatch.setattr(precision, "Path", CpuInfo)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert precision.onednn_isa_allows_bf16(cap) is allowed
    assert precision.bf16_supported("cpu") is allowed
