"""Exact resume: a run SIGKILLed mid-step (or mid-checkpoint) and resumed ends where an
uninterrupted run with the same seed ends, weight for weight and metric for metric.

The uninterrupted reference runs in this process; the killed runs run `python -m rlvr train` in
a subprocess; the resumes run in this process through the CLI entry point. All use one torch
thread, so CPU kernels reduce in the same order everywhere and the comparison can be bitwise.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.checkpoint.full import checkpoints_dir, latest_checkpoint
from rlvr.cli.main import main as cli_main
from rlvr.config import load_config
from rlvr.training.trainer import Trainer
from sitecustomize import SLOW_SAVE_ENV

MAX_STEPS = 4
SAVE_EVERY = 2
COMPARED = ("reward_mean", "policy_loss", "grad_norm")


def overrides(model_dir: Path, out: Path, name: str) -> list[str]:
    return [
        f"model.name_or_path={model_dir}",
        f"train.output_dir={out}",
        f"train.run_name={name}",
        "data.template=none",
        # 24 new tokens make a step long enough (a few tenths of a second) to be killed inside
        "rollout.max_new_tokens=24",
        "logging.progress=false",
        "eval.max_problems=4",
        "reward.specs=[{name: 'toy_rewards:count_sevens'}]",
        f"train.max_steps={MAX_STEPS}",
        f"train.save_every={SAVE_EVERY}",
        "train.max_checkpoints=2",
        "train.threads=1",
        "train.lr=1e-2",
    ]


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory) -> Path:
    """An uninterrupted run; returns its run directory."""
    before = torch.get_num_threads()
    out = tmp_path_factory.mktemp("ref")
    try:
        summary = Trainer(load_config(None, overrides(tiny_model_dir, out, "ref"))).fit()
    finally:
        torch.set_num_threads(before)
    return Path(summary["run_dir"])


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "final" / "model.safetensors"))


def start_run(model_dir: Path, out: Path, name: str, env_extra: dict | None = None):
    env = {**os.environ, **(env_extra or {})}
    cmd = [sys.executable, "-m", "rlvr", "train", *overrides(model_dir, out, name)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def kill_when(proc: subprocess.Popen, ready, timeout: float = 120.0) -> None:
    """Poll every 2 ms until ``ready()``; then SIGKILL the process."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"run ended before the kill point: {proc.stderr.read().decode()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("kill point not reached in time")
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


def assert_same_as_reference(run_dir: Path, reference: Path) -> None:
    got, want = metrics(run_dir), metrics(reference)
    # every step exactly once, in order (step 0 is the eval before training)
    assert [m["step"] for m in got] == list(range(MAX_STEPS + 1))
    for g, w in zip(got[1:], want[1:], strict=True):
        for key in COMPARED:  # bitwise: same seed, same kernels, one thread
            assert g[key] == w[key], (g["step"], key, g[key], w[key])
    a, b = final_weights(run_dir), final_weights(reference)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"


def test_reference_run_changes_the_weights(reference, tiny_model_dir):
    """Guard for the tests below: equal final weights must mean something (training moved them)."""
    start = load_file(str(tiny_model_dir / "model.safetensors"))
    end = final_weights(reference)
    assert any(not torch.equal(start[k], end[k]) for k in start)
    assert [c.step for c in [latest_checkpoint(reference)]] == [MAX_STEPS]


def test_sigkill_in_the_middle_of_a_step_then_resume_is_exact(
    reference, tiny_model_dir, tmp_path, restore_threads
):
    proc = start_run(tiny_model_dir, tmp_path, "killed")
    run_dir = tmp_path / "killed"
    marker = run_dir / "checkpoints" / "step_000002" / "COMPLETE"
    kill_when(proc, marker.exists)
    # killed inside step 3: its metrics line was never written and step 2 is the newest checkpoint
    assert [m["step"] for m in metrics(run_dir)] == [0, 1, 2]
    assert latest_checkpoint(run_dir).step == 2
    assert json.loads((run_dir / "status.json").read_text())["state"] == "running"

    assert cli_main(["train", "--resume", str(run_dir)]) == 0
    assert_same_as_reference(run_dir, reference)


def test_kill_during_a_checkpoint_write_resumes_from_the_previous_one(
    reference, tiny_model_dir, tmp_path, restore_threads
):
    # The test hook (tests/sitecustomize.py) pauses each save for 0.5 s before COMPLETE.
    proc = start_run(tiny_model_dir, tmp_path, "torn", {SLOW_SAVE_ENV: "0.5"})
    run_dir = tmp_path / "torn"
    torn = checkpoints_dir(run_dir) / ".tmp-step_000004"
    kill_when(proc, lambda: (torn / "model" / "model.safetensors").exists())
    assert torn.is_dir() and not (torn / "COMPLETE").exists()
    assert not (checkpoints_dir(run_dir) / "step_000004").exists()
    assert latest_checkpoint(run_dir).step == 2
    # the final step was logged before its checkpoint: resume must drop that line and redo step 4
    assert [m["step"] for m in metrics(run_dir)] == [0, 1, 2, 3, 4]

    cfg = load_config(run_dir / "config.yaml", ["train.resume=auto"])
    Trainer(cfg).fit()
    assert_same_as_reference(run_dir, reference)
    assert not torn.exists()  # the torn folder is cleaned up by the next rotation


def test_lora_ppo_with_adaptive_kl_resumes_exactly(tiny_model_dir, tmp_path, restore_threads):
    """In process: the adapter, the value head and the adaptive KL coefficient come back exactly.

    Run A goes 4 steps with checkpoints at 2 and 4. B is a copy of A that lost its step-4
    checkpoint and final model; resumed from step 2 it must redo steps 3-4 exactly as A did.
    """
    extra = [
        "algo.objective=ppo",
        "algo.beta=0.05",
        "algo.kl_target=0.001",  # the coefficient moves every step, so it must be restored
        "model.lora.enabled=true",
        "model.lora.rank=4",
        "eval.before_after=false",
        "rollout.max_new_tokens=8",
    ]
    Trainer(load_config(None, overrides(tiny_model_dir, tmp_path, "a") + extra)).fit()
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoints" / "step_000004")
    shutil.rmtree(b / "final")
    Trainer(load_config(b / "config.yaml", [f"train.resume={b}"])).fit()

    ma, mb = metrics(a), metrics(b)
    assert [m["step"] for m in mb] == [1, 2, 3, 4]
    for x, y in zip(ma, mb, strict=True):
        for key in (*COMPARED, "kl_coef", "value_loss"):
            assert x[key] == y[key], (x["step"], key)
    assert len({m["kl_coef"] for m in ma}) > 1  # the adaptive coefficient did move
    wa = load_file(str(a / "final" / "adapter_model.safetensors"))
    wb = load_file(str(b / "final" / "adapter_model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    ha = torch.load(a / "checkpoints" / "step_000004" / "trainer_state.pt", weights_only=True)
    hb = torch.load(b / "checkpoints" / "step_000004" / "trainer_state.pt", weights_only=True)
    for k in ha["objective"]:
        assert torch.equal(ha["objective"][k], hb["objective"][k]), k
