"""The vLLM engine samples and evaluates with the weights of the step it is labelled with.

Runs are ``rlvr train`` child processes at float32 (``model.autocast=off``: the engine computes
in float32 too), so an engine holding the trainer's weights agrees with it to rounding
(``LOGPROB_TOL``), while one step at lr 1e-2 moves log-probs by tenths of a nat. Bugs these
catch: the engine was built from the base weights before ``--resume`` restored the checkpoint (the
first resumed step sampled from the wrong policy). (``rollout.sync_every > 1``, under which an
in-training eval once measured older engine weights than its step, is refused with vLLM: a
checkpoint cannot restore the engine's older weights; tests/training/test_engine_versions.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_support import LOGPROB_TOL

pytestmark = pytest.mark.vllm


def _train(model_dir: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "rlvr", "train",
        f"model.name_or_path={model_dir}", f"train.output_dir={out}",
        "model.autocast=off", "rollout.engine=vllm", "train.lr=1e-2", "train.preflight_step=0",
        "data.template=none", "data.max_prompt_tokens=64", "rollout.max_new_tokens=8",
        "algo.group_size=4", "algo.prompts_per_step=2", "eval.before_after=false",
        "logging.progress=false", "reward.specs=[{name: 'toy_rewards:count_sevens'}]",
        *extra,
    ]  # fmt: skip
    res = subprocess.run(cmd, env=dict(os.environ), capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_first_resumed_step_samples_from_the_restored_weights(vllm_model_dir, tmp_path):
    out = tmp_path / "runs"
    _train(vllm_model_dir, out, "train.run_name=r", "train.max_steps=1", "train.save_every=1")
    run = out / "r"
    _train(vllm_model_dir, out, "--resume", str(run), "train.max_steps=2")
    rows = [r for r in _rows(run) if "logprob_diff_max" in r]
    assert [r["step"] for r in rows] == [1, 2]
    # step 2 sampled from the restored step-1 weights: engine and trainer agree to rounding
    assert rows[1]["logprob_diff_max"] < LOGPROB_TOL, rows[1]
    assert rows[1]["policy_version"] == 2.0  # one update before the kill, one after
