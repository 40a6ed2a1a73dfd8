"""The command line's side handling, the worker commands and the cross-side checks."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.harness.workloads import prompt_digest
from benchmarks.step import (
    DEFAULT_SIDES,
    KNOWN_SIDES,
    all_ratios,
    parse_args,
    parse_sides,
    prompts_agree,
    worker_command,
)
from rlvr.allocator import resolve as resolve_allocator


def test_default_is_all_three_sides():
    assert parse_args([]).sides == ["rlvr", "rlvr-vllm", "trl"]
    assert parse_args(["--sides", "trl-whole,rlvr"]).sides == ["trl-whole", "rlvr"]
    assert set(parse_args([]).sides) < set(KNOWN_SIDES)
    assert DEFAULT_SIDES == "rlvr,rlvr-vllm,trl"


def test_sides_keep_the_given_order():
    assert parse_sides("trl, rlvr-vllm") == ["trl", "rlvr-vllm"]
    assert parse_sides("rlvr,trl") == ["rlvr", "trl"]
    assert parse_args(["--sides", "rlvr-vllm"]).sides == ["rlvr-vllm"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rlvr,vllm", r"unknown \['vllm'\]; known: rlvr, rlvr-vllm, trl"),
        ("", "no side given"),
        (" , ", "no side given"),
        ("rlvr,trl,rlvr", "rlvr given more than once"),
    ],
)
def test_bad_sides_are_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_sides(text)


def test_bad_sides_on_the_command_line_exit_with_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--sides", "rlvr,hf"])
    assert exc.value.code == 2
    assert "unknown ['hf']; known: rlvr, rlvr-vllm, trl" in capsys.readouterr().err


def test_worker_commands(tmp_path):
    spec = tmp_path / "spec.json"
    vpy = Path("/x/.venv-vllm/bin/python")
    argv, env = worker_command("rlvr-vllm", vpy, spec, threads=2)
    assert argv == [str(vpy), "-m", "benchmarks.harness.worker_rlvr", str(spec)]
    assert env["OMP_NUM_THREADS"] == "2" and "src" not in env["PYTHONPATH"]
    argv, _ = worker_command("rlvr", Path(sys.executable), spec, threads=2)
    assert argv[1:3] == ["-m", "benchmarks.harness.worker_rlvr"]
    argv, env = worker_command("trl", Path("/t/python"), spec, threads=1)
    assert argv[1:3] == ["-m", "benchmarks.harness.worker_trl"]
    assert env["PYTHONPATH"].endswith("src")  # rlvr's grader comes from src/ in TRL's venv
    assert worker_command("trl-whole", Path("/t/python"), spec, threads=1)[0] == argv[:2] + [
        "benchmarks.harness.worker_trl",
        str(spec),
    ]
    with pytest.raises(ValueError, match="unknown side"):
        worker_command("vllm", vpy, spec, threads=1)


def test_worker_commands_preload_the_allocator_asked_for(tmp_path, monkeypatch):
    """The rlvr sides get what `rlvr train` would preload; TRL keeps the system malloc unless
    --trl-allocator names one."""
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    spec = tmp_path / "spec.json"
    kind, lib = resolve_allocator("auto")
    _, env = worker_command("rlvr", Path(sys.executable), spec, threads=2, allocator="auto")
    assert env.get("LD_PRELOAD") == (str(lib) if lib else None)
    _, env = worker_command("trl", Path("/t/python"), spec, threads=2)
    assert "LD_PRELOAD" not in env
    _, env = worker_command("rlvr", Path(sys.executable), spec, threads=2, allocator="system")
    assert "LD_PRELOAD" not in env
    args = parse_args(["--sides", "rlvr,trl", "--trl-allocator", "auto"])
    assert (args.allocator, args.trl_allocator) == ("auto", "auto")


def _res(step_s):
    return {"summary": {"step_time_median_s": step_s, "peak_rss_mb": 100.0}}


def test_ratios_per_rlvr_side_against_trl():
    r = all_ratios({"trl": _res(4.0), "rlvr-vllm": _res(1.0), "rlvr": _res(2.0)})
    assert list(r) == ["rlvr", "rlvr-vllm"]
    assert r["rlvr"]["step_time_median_s"] == 0.5
    assert r["rlvr-vllm"]["step_time_median_s"] == 0.25
    assert r["rlvr-vllm"]["peak_rss_mb"] == 1.0
    assert all_ratios({"rlvr": _res(2.0), "rlvr-vllm": _res(1.0)}) == {}
    assert list(all_ratios({"rlvr-vllm": _res(1.0), "trl": _res(4.0)})) == ["rlvr-vllm"]


def test_prompts_agree_checks_every_side():
    schedule = [[{"prompt": "a"}, {"prompt": "b"}], [{"prompt": "c"}, {"prompt": "d"}]]

    def worker(steps, lens=((1, 1), (1, 1))):
        recs = [
            {"prompt_digest": prompt_digest([r["prompt"] for r in step]), "prompt_lens": list(n)}
            for step, n in zip(schedule[:steps], lens, strict=False)
        ]
        return SimpleNamespace(steps=recs)

    same = {"rlvr": worker(2), "rlvr-vllm": worker(2), "trl": worker(1)}
    assert prompts_agree(same, schedule)
    # the third side counted one prompt token more on step 2
    odd = {"rlvr": worker(2), "trl": worker(2), "rlvr-vllm": worker(2, ((1, 1), (1, 2)))}
    assert not prompts_agree(odd, schedule)
    # the third side trained on other prompts
    other = worker(2)
    other.steps[1]["prompt_digest"] = prompt_digest(["d", "c"])
    assert not prompts_agree({"rlvr": worker(2), "trl": worker(2), "rlvr-vllm": other}, schedule)
