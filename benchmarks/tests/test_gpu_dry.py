"""The GPU benchmark's CPU dry mode end to end (so the script cannot rot between GPU sessions):
a real run of ``python -m benchmarks.gpu.bench --dry`` in its own process, and the tables it
writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
import zipfile
from importlib import metadata
from pathlib import Path

import psutil

from benchmarks.harness.workloads import prompt_digest

ROOT = Path(__file__).resolve().parents[2]
SHAPES = ROOT / "benchmarks" / "gpu" / "shapes"
RUN_SH = ROOT / "benchmarks" / "gpu" / "run.sh"
STAGES = ("env", "tests", "bench-tiny", "fsdp", "chunks", "bench-tiny-b")


def test_the_dry_mode_runs_both_sides_and_writes_its_tables(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "benchmarks.gpu.bench", "--dry", "--out", str(tmp_path)]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    [json_file] = tmp_path.glob("gpu-*-dry.json")
    [md_file] = tmp_path.glob("gpu-*-dry.md")
    report = json.loads(json_file.read_text())
    assert report["dry"] and report["device"] == "cpu (dry mode)"
    assert report["bf16_peak_flops"] > 0
    shape = report["shapes"]["tiny"]
    rlvr = shape["sides"]["rlvr"]
    # equal work held: every reply exactly the workload's length (EOS beyond the model's rows)
    assert rlvr["completion_lens"] == [report["workload"]["reply_tokens"]] == [8]
    assert rlvr["measured_steps"] == 1 and rlvr["step_time_median_s"] > 0
    assert rlvr["phase_median_s"]["generate"] > 0 and rlvr["phase_median_s"]["update"] > 0
    assert rlvr["completion_tokens_per_step"] == 2 * 2 * 8
    assert rlvr["activation_checkpointing"] is False  # equal work (TRL's default would be True)
    text = md_file.read_text()
    for row in (
        "step time (s, median)",
        "generation (s, median)",
        "update (s, median)",
        "tokens/s",
        "peak GPU memory (GiB)",
        "update MFU",
    ):
        assert f"| {row}" in text, row
    if "trl" in shape["sides"]:  # TRL installed: its column and the ratios are filled
        assert shape["ratios_rlvr_over_trl"]["step_time_median_s"] > 0
        assert shape["sides"]["trl"]["prompt_digests"] == rlvr["prompt_digests"]
        assert shape["sides"]["trl"]["activation_checkpointing"] is False
    else:  # otherwise the skip is said, in the table and the JSON
        assert "TRL's side skipped" in text
        assert any("TRL's side skipped" in n for n in report["notes"])
        assert shape["ratios_rlvr_over_trl"]["step_time_median_s"] is None


def test_the_gpu_worker_moves_the_step_counter_so_each_step_draws_its_own_seed(tmp_path):
    """The GPU worker drives rlvr's real loop: step k seeds from (train.seed, k) as `fit` does
    (a stuck counter reseeded every step alike)."""
    from benchmarks.gpu.bench import build_shape, side_spec
    from rlvr.training.step import step_seed
    from rlvr.training.tiny import build_fixed_length_tokenizer

    tok = build_fixed_length_tokenizer(json.loads((SHAPES / "tiny.json").read_text())["vocab_size"])
    model_dir = build_shape("tiny", tmp_path / "model", tok, "cpu")
    spec = side_spec(
        "tiny", model_dir, tok, "cpu", prompts=2, group=2, new_tokens=4, micro=2, steps=3
    )
    spec.update(side="rlvr", work_dir=str(tmp_path / "rlvr"), padded=False)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}
    cmd = [sys.executable, "-m", "benchmarks.gpu.worker", "rlvr"]
    cmd += [str(tmp_path / "spec.json"), str(tmp_path / "result.json")]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    records = json.loads((tmp_path / "result.json").read_text())["records"]
    assert [r["torch_seed"] for r in records] == [step_seed(0, k) for k in range(3)]
    # and the prompts are the schedule's, step by step (the digests TRL's side is checked on)
    want = [prompt_digest([row["prompt"] for row in step]) for step in spec["schedule"]]
    assert [r["prompt_digest"] for r in records] == want


def _bench_env(tmp_path: Path, **more: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}
    env.update(OMP_NUM_THREADS="1", TMPDIR=str(tmp_path), **more)
    return env


def test_a_side_that_hangs_still_leaves_the_other_sides_table_when_the_bench_is_killed(tmp_path):
    """The tables are written after every side: the bench killed by its caller (run.sh's cap)
    while a side hangs still leaves the sides before it; a side past its own timeout is a row."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "benchmarks.gpu.bench", "--dry", "--out", str(out)]
    cmd += ["--sides", "rlvr,rlvr-padded", "--stem", "t", "--timeout", "600"]
    env = _bench_env(tmp_path, RLVR_GPU_BENCH_FAIL="rlvr-padded:hang")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:  # wait for the hanging side, then kill the bench as `timeout` would
        for line in proc.stdout:
            if "[gpu-bench] tiny rlvr: step" in line:
                break
        else:
            raise AssertionError("the rlvr side never finished")
        hang_log = out / "work" / "tiny" / "rlvr-padded.log"
        for _ in range(120):  # the padded side's worker is up and hanging
            if hang_log.exists() and "(hang)" in hang_log.read_text():
                break
            time.sleep(0.5)
        else:
            raise AssertionError("the hanging side never started")
    finally:
        proc.terminate()  # SIGTERM, as `timeout` sends
        proc.wait(timeout=60)
    # the hanging worker went with it (it would hold the GPU through the later stages)
    time.sleep(1)
    left = [
        p for p in psutil.process_iter(["cmdline"]) if str(out) in " ".join(p.info["cmdline"] or [])
    ]
    for p in left:  # never leave one behind, even when the assertion fails
        p.kill()
    left = [p.pid for p in left]
    assert left == [], f"workers left running: {left}"
    report = json.loads((out / "t.json").read_text())
    rlvr = report["shapes"]["tiny"]["sides"]["rlvr"]
    assert rlvr["measured_steps"] == 1 and rlvr["step_time_median_s"] > 0
    assert "| step time (s, median) | " in (out / "t.md").read_text()
    # a side's own timeout: recorded as a row with its log's tail, and the call goes on
    cmd[cmd.index("600")] = "10"
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads((out / "t.json").read_text())
    padded = report["shapes"]["tiny"]["sides"]["rlvr-padded"]
    assert padded["failed"] == "the rlvr-padded worker ran out of time (10 s)"
    assert "failure injected by RLVR_GPU_BENCH_FAIL (hang)" in padded["log_tail"]
    assert "**rlvr-padded: the rlvr-padded worker ran out of time" in (out / "t.md").read_text()


def test_the_rehearsal_of_the_whole_call(tmp_path):
    """run.sh REHEARSE=1: the call's stages in order, each with its budget line, the files that
    come back (at most 8), a failed side recorded in the tables, and the summary printed last.
    An earlier call's work folder is there (a rerun on a warm machine): its run directories made
    rlvr's Trainer refuse to start ("already holds a run"), losing rlvr's side of every shape."""
    out = tmp_path / "out"
    for shape in ("tiny", "tiny-b"):
        stale = tmp_path / "rlvr-gpu-bench" / shape / "rlvr" / "rlvr-run"
        stale.mkdir(parents=True)
        (stale / "metrics.jsonl").write_text('{"step": 1}\n')
    # carried wheels: one the image lacks, and a broken typing-extensions of the version the
    # image already has (pydantic-core needs 4.16.0 or later): installed, it would shadow the
    # image's and rlvr (pydantic) would not import
    wheels = tmp_path / "wheels"
    _wheel(wheels, "rlvr_probe", "1.0", "MARK = 'carried'\n")
    have = metadata.version("typing_extensions")
    assert _version(have) >= (4, 16, 0), have
    _wheel(wheels, "typing_extensions", have, "raise ImportError('the carried wheel shadowed')\n")
    env = _bench_env(
        tmp_path,
        REHEARSE="1",
        OUT=str(out),
        PYTHON=sys.executable,
        WHEELS=str(wheels),
        BENCH_ARGS="--sides rlvr,rlvr-padded",
        RLVR_GPU_BENCH_FAIL="rlvr-padded",
    )
    res = subprocess.run(
        ["bash", str(RUN_SH)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    text = res.stdout
    assert res.returncode == 1, text[-3000:] + res.stderr[-3000:]  # a side failed
    env_txt = (out / "env.txt").read_text()
    assert "installing 1 wheels into" in env_txt, env_txt
    assert f"not installed: typing-extensions {have}: the image's {have}" in env_txt
    site = tmp_path / "rlvr-site"
    assert (site / "rlvr_probe.py").is_file() and not (site / "typing_extensions.py").exists()
    stem = next(out.glob("gpu-*-rehearsal.json")).stem
    files = {p.name for p in out.iterdir()}
    assert files == {"run.log", "env.txt", "gpu-tests.log", "bench.log", "worker-logs.tgz"} | {
        f"{stem}.json",
        f"{stem}.md",
    }
    assert len(files) <= 8 and all(p.is_file() for p in out.iterdir())
    ends = [text.index(f"[run.sh] stage {s}: exit") for s in STAGES]
    assert ends == sorted(ends)
    summary = text.index("[run.sh] ===== summary")
    assert summary > ends[-1]
    tail = text[summary:]
    for s in STAGES:  # every stage's budget line again in the summary
        assert f"[run.sh] stage {s}: exit" in tail, s
    assert "skipped" in tail  # the -m gpu counts (skipped without CUDA)
    # the log-probs study's table in the summary (its rows: 2 lengths x 3 sides), its JSON in
    # the worker logs' archive
    chunks = tail[tail.index("# Log-probs without the full logits") :]
    assert chunks.count("\n| 24 | ") == 3 and "head grad rel diff" in chunks
    with tarfile.open(out / "worker-logs.tgz") as tar:
        names = tar.getnames()
    assert any(n.startswith("./chunks/") and n.endswith("-logprob-chunks-cpu.json") for n in names)
    report = json.loads((out / f"{stem}.json").read_text())
    assert list(report["shapes"]) == ["tiny", "tiny-b"]  # the second stage appended
    for shape in report["shapes"].values():
        assert shape["sides"]["rlvr"]["step_time_median_s"] > 0
        assert "failure injected" in shape["sides"]["rlvr-padded"]["log_tail"]
    md = (out / f"{stem}.md").read_text()
    assert md.count("**rlvr-padded: the rlvr-padded worker failed (exit 3)**") == 2
    # the tables are the last thing printed (what the call's reply shows)
    assert tail.rstrip().splitlines()[-2].startswith("Ratios below 1")
    assert (out / "run.log").read_text().endswith(text[summary:])


def test_the_call_stops_when_rlvr_does_not_import(tmp_path):
    """A Python without site-packages (-S: no torch, no pydantic): the env stage says STOP
    and no later stage runs."""
    py = tmp_path / "python"
    py.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    py.chmod(0o755)
    out = tmp_path / "out"
    env = _bench_env(tmp_path, REHEARSE="1", OUT=str(out), PYTHON=str(py))
    res = subprocess.run(
        ["bash", str(RUN_SH)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 1, res.stdout[-3000:]
    assert "[run.sh] STOP: rlvr does not import" in res.stdout
    assert "[run.sh] stage env: exit 1" in res.stdout
    assert "stage tests" not in res.stdout and "stage bench" not in res.stdout
    assert {p.name for p in out.iterdir()} == {"run.log", "env.txt"}


def test_the_workers_keep_the_callers_pythonpath(monkeypatch):
    """run.sh puts the carried wheels on PYTHONPATH: the workers must still see them."""
    from benchmarks.gpu.bench import worker_env

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/tmp/rlvr-site", "/elsewhere"]))
    paths = worker_env()["PYTHONPATH"].split(os.pathsep)
    assert paths == [str(ROOT), str(ROOT / "src"), "/tmp/rlvr-site", "/elsewhere"]


def test_a_carried_wheel_of_a_package_the_image_serves_stays_out(tmp_path):
    """typing-extensions and peft go in only where the image's version is missing or below the
    floor; every other carried wheel goes in whatever the image has."""
    from benchmarks.gpu.wheels import to_install

    names = ["typing_extensions-4.16.0-py3-none-any.whl", "peft-0.21.2-py3-none-any.whl"]
    names += ["pydantic-2.14.4-py3-none-any.whl", "trl-1.16.0-py3-none-any.whl"]
    wheels = [tmp_path / n for n in names]

    def image(versions):
        return lambda name: versions.get(name.replace("_", "-"))

    chosen, skipped = to_install(wheels, image({"typing-extensions": "4.16.1", "peft": "0.18.0"}))
    assert [w.name for w in chosen] == sorted(names[2:])
    assert skipped == [
        "peft 0.21.2: the image's 0.18.0 is at least 0.18",
        "typing-extensions 4.16.0: the image's 4.16.1 is at least 4.16.0",
    ]
    # an older image: both go in; an image without them: both go in; the others always do
    for versions in ({"typing-extensions": "4.15.0", "peft": "0.17.1", "trl": "9.0"}, {}):
        chosen, skipped = to_install(wheels, image(versions))
        assert sorted(w.name for w in chosen) == sorted(names) and skipped == []


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3])


def _wheel(folder: Path, name: str, version: str, source: str) -> Path:
    """A pure-Python wheel holding one module, as pip installs it with --target."""
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": source,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for f, text in {**files, f"{info}/RECORD": record}.items():
            z.writestr(f, text)
    return path
