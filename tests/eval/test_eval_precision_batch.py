"""`rlvr eval` numbers depend on neither the training autocast nor the eval batch size; they
say how they were measured (provenance, mode settings, truncation, reply length)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.cli.eval import run_provenance_warnings
from rlvr.cli.main import main
from rlvr.config import load_config
from rlvr.eval.engine import resolve_eval_dtype
from rlvr.eval.provenance import differences, warn_if_different

# prompts of very different lengths: a batch left-pads all but the longest
STOP = "rollout.stop=['a']"  # ends some of the sharp model's greedy replies early
PROMPTS = ["1+1", "What is 12 * 15?", "7", "Compute 3 + 4 + 5 + 6 + 7 + 8 + 9 + 10 please", "99-9"]


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("probe") / "probe.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "answer": "2"}) + "\n" for p in PROMPTS))
    return path


def run_eval(model: Path, probe: Path, out: Path, *overrides: str, modes: str = "greedy") -> dict:
    settings = [
        "data.template=none",
        "rollout.max_new_tokens=8",
        "train.threads=1",
        "reward.specs=[{name: 'eval_toy_rewards:first_char_even'}]",
        *overrides,
    ]
    argv = ["eval", str(model), *settings, "--data", str(probe), "--modes", modes]
    if "sampling" in modes or "nondet" in modes:
        argv += ["--k", "3"]
    argv += ["--out", str(out)]
    assert main(argv) == 0
    return json.loads(out.read_text())


def test_autocast_does_not_change_the_eval(sharp_model_dir, probe, tmp_path, capsys) -> None:
    bf16 = run_eval(sharp_model_dir, probe, tmp_path / "a.json", "model.autocast=bf16")
    off = run_eval(sharp_model_dir, probe, tmp_path / "b.json", "model.autocast=off")
    capsys.readouterr()
    assert bf16["records"] == off["records"]
    assert bf16["provenance"]["dtype"] == off["provenance"]["dtype"] == "float32"
    # ... and the eval dtype is what decides: bf16 is recorded when asked for
    asked = run_eval(sharp_model_dir, probe, tmp_path / "c.json", "eval.dtype=bfloat16")
    assert asked["provenance"]["dtype"] == "bfloat16"


def test_records_do_not_depend_on_eval_batch_size(sharp_model_dir, probe, tmp_path, capsys):
    modes = "greedy,sampling,nondet_proxy"
    outs = [
        run_eval(
            sharp_model_dir,
            probe,
            tmp_path / f"{b}.json",
            f"eval.batch_size={b}",
            STOP,
            modes=modes,
        )
        for b in (1, 2, 8)
    ]
    capsys.readouterr()
    assert [o["provenance"]["batch_size"] for o in outs] == [1, 2, 8]
    for other in outs[1:]:
        assert other["records"] == outs[0]["records"]
        assert other["results"] == outs[0]["results"]
    greedy = outs[0]["records"]["probe"]["greedy"]
    assert len({r["responses"][0] for r in greedy}) > 1  # the comparison compares something
    assert {r["finish_reasons"][0] for r in greedy} == {"stop", "length"}


def test_table_and_json_say_how_each_number_was_measured(sharp_model_dir, probe, tmp_path, capsys):
    capsys.readouterr()
    out = run_eval(
        sharp_model_dir, probe, tmp_path / "t.json", STOP, modes="greedy,sampling,nondet_proxy"
    )
    printed = capsys.readouterr().out
    rows = {
        cells[0]: cells[1:]
        for line in printed.splitlines()
        if line.startswith("| ")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert rows[""][:8] == [
        "value", "mode", "k", "temperature", "top_p", "truncated", "mean_len", "problems",
    ]  # fmt: skip
    assert rows["probe greedy_pass@1"][1:5] == ["greedy", "1", "0", "1"]
    assert rows["probe maj@3"][1:5] == ["sampling", "3", "0.6", "1"]
    assert rows["probe nondet_proxy_pass@3"][1:5] == ["nondet_proxy", "3", "0", "1"]
    # truncation and mean length beside every number, computed from the records
    for mode in ("greedy", "sampling", "nondet_proxy"):
        records = out["records"]["probe"][mode]
        reasons = [r for rec in records for r in rec["finish_reasons"]]
        lengths = [n for rec in records for n in rec["lengths"]]
        share = sum(r == "length" for r in reasons) / len(reasons)
        assert out["results"]["probe"][f"{mode}/truncated_frac"] == share
        assert out["results"]["probe"][f"{mode}/mean_reply_tokens"] == sum(lengths) / len(lengths)
        assert all(n <= 8 for n in lengths)
    # the stop string ends some replies, the token limit the others
    assert 0 < out["results"]["probe"]["greedy/truncated_frac"] < 1
    assert out["results"]["probe"]["greedy/mean_reply_tokens"] < 8
    prov = out["provenance"]
    for field in ("engine", "dtype", "batch_size", "max_new_tokens", "template", "grader"):
        assert prov[field] is not None
    assert prov["max_new_tokens"] == 8 and prov["grader"] == ["eval_toy_rewards:first_char_even"]
    assert prov["torch"] and prov["transformers"] and prov["device"] == "cpu"
    assert "measured with: hf engine, float32" in printed


def test_eval_dtype_default_does_not_follow_the_cpu(monkeypatch) -> None:
    import rlvr.model.precision as policy

    monkeypatch.setattr(policy, "bf16_supported", lambda device="cpu": True)
    for autocast in ("auto", "bf16", "off"):
        cfg = load_config(None, [f"model.autocast={autocast}"])
        assert str(resolve_eval_dtype(cfg, "cpu")) == "torch.float32"
    cfg = load_config(None, ["model.dtype=bfloat16", "eval.dtype=float32"])
    with pytest.raises(ValueError, match="eval.dtype=float32 with model.dtype=bfloat16"):
        resolve_eval_dtype(cfg, "cpu")


def test_differences_name_the_field(tmp_path) -> None:
    a = {"engine": "hf", "dtype": "float32", "max_new_tokens": 48, "cpu_flags": "avx2"}
    b = {**a, "dtype": "bfloat16", "cpu_flags": "avx2 avx512f avx512_bf16"}
    assert differences(a, a) == []
    diff = differences(a, b)
    assert [d.split(":")[0] for d in diff] == ["dtype", "cpu_flags"]
    assert "'float32' vs 'bfloat16'" in diff[0]
    (warning,) = warn_if_different({"run A": a, "run B": b})
    assert warning.startswith("run B was measured differently from run A: dtype")
    # rlvr eval compares itself with the run's last in-training eval
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "step_000002.json").write_text(json.dumps({"provenance": a}))
    (msg,) = run_provenance_warnings(tmp_path, b)
    assert "step_000002.json" in msg and "dtype" in msg
    assert run_provenance_warnings(tmp_path, a) == []
