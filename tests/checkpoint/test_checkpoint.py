"""The checkpoint format on disk: atomic writes, the COMPLETE manifest, torn folders ignored,
rotation, a failed save (disk full) that leaves the previous checkpoint usable, RNG round trips."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.checkpoint.full import (
    COMPLETE,
    CheckpointError,
    checkpoint_step,
    checkpoints_dir,
    latest_checkpoint,
    list_checkpoints,
    read_state,
    rng_state,
    rotate_checkpoints,
    set_rng_state,
    write_checkpoint,
)


class StubModel:
    """Stands in for a HF model: ``save_pretrained`` writes one small weights file."""

    def __init__(self, payload: bytes = b"w" * 100):
        self.payload = payload

    def save_pretrained(self, folder: Path) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "weights.bin").write_bytes(self.payload)


def write(run_dir: Path, step: int, **kw) -> Path:
    return write_checkpoint(
        run_dir,
        step,
        model=kw.get("model", StubModel()),
        tokenizer=None,
        tensors=kw.get("tensors", {"x": torch.arange(4)}),
        plain=kw.get("plain", {"step": step}),
        config_yaml="train:\n  seed: 0\n",
    )


def test_layout_manifest_and_round_trip(tmp_path, tiny_tokenizer):
    from rlvr.training.tiny import build_tiny_model

    model = build_tiny_model(tiny_tokenizer)
    tensors = {"optimizer": {"state": {0: {"exp_avg": torch.randn(3, 2)}}}, "rng": torch.arange(5)}
    plain = {"step": 7, "sampler": {"epoch": 1, "position": 3, "seed": 0}}
    path = write_checkpoint(
        tmp_path,
        7,
        model=model,
        tokenizer=tiny_tokenizer,
        tensors=tensors,
        plain=plain,
        config_yaml="a: 1\n",
    )
    assert path == tmp_path / "checkpoints" / "step_000007"
    assert sorted(p.name for p in checkpoints_dir(tmp_path).iterdir()) == ["step_000007"]
    # the manifest lists every other file of the folder with its size on disk
    manifest = json.loads((path / COMPLETE).read_text())
    on_disk = {
        str(p.relative_to(path)): p.stat().st_size
        for p in path.rglob("*")
        if p.is_file() and p.name != COMPLETE
    }
    assert manifest["files"] == on_disk and manifest["step"] == 7
    assert "model/model.safetensors" in on_disk and "model/tokenizer.json" in on_disk
    got_tensors, got_plain = read_state(path)
    assert got_plain == plain
    assert torch.equal(
        got_tensors["optimizer"]["state"][0]["exp_avg"], tensors["optimizer"]["state"][0]["exp_avg"]
    )
    assert torch.equal(got_tensors["rng"], tensors["rng"])


def test_torn_or_damaged_folders_are_never_picked(tmp_path):
    write(tmp_path, 2)
    four = write(tmp_path, 4)
    ckdir = checkpoints_dir(tmp_path)
    # a folder that lost its marker (a kill while it was being deleted) is not a checkpoint
    shutil.copytree(four, ckdir / "step_000006")
    (ckdir / "step_000006" / COMPLETE).unlink()
    # an interrupted save: a temp folder, even one with a marker, is never a checkpoint
    shutil.copytree(four, ckdir / ".tmp-step_000008")
    assert [c.step for c in list_checkpoints(tmp_path)] == [2, 4]
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        checkpoint_step(ckdir / "step_000006")
    # a file that does not have the size the manifest recorded: step 4 is damaged, 2 is newest
    (four / "model" / "weights.bin").write_bytes(b"w" * 10)
    assert latest_checkpoint(tmp_path).step == 2
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        read_state(four)


def test_rewriting_a_step_replaces_it_whole(tmp_path):
    """A resumed run re-saves a step it already saved before being killed: the new one wins."""
    write(tmp_path, 2, plain={"v": "old"})
    write(tmp_path, 2, plain={"v": "new"}, model=StubModel(b"n" * 7))
    path = latest_checkpoint(tmp_path).path
    assert read_state(path)[1] == {"v": "new"}
    assert (path / "model" / "weights.bin").read_bytes() == b"n" * 7


@settings(max_examples=15, deadline=None)
@given(
    steps=st.sets(st.integers(1, 40), min_size=1, max_size=7),
    keep=st.integers(1, 4),
    protect=st.sets(st.integers(1, 40), max_size=2),
    torn=st.sets(st.integers(41, 50), max_size=2),
)
def test_rotation_keeps_the_newest_and_the_protected(steps, keep, protect, torn):
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        for s in steps:
            write(run, s)
        ckdir = checkpoints_dir(run)
        for s in torn:  # torn leftovers newer than everything: must go, never count as newest
            (ckdir / f"step_{s:06d}").mkdir()
        (ckdir / ".tmp-step_000099").mkdir()
        rotate_checkpoints(run, keep, protect)
        expected = set(sorted(steps)[-keep:]) | (protect & steps)
        assert {c.step for c in list_checkpoints(run)} == expected
        assert {p.name for p in ckdir.iterdir()} == {f"step_{s:06d}" for s in expected}


DISK_FULL_SCRIPT = r"""
import json, resource, sys
from pathlib import Path
import torch
from rlvr.checkpoint.full import CheckpointError, write_checkpoint

class Stub:
    def save_pretrained(self, folder):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "weights.bin").write_bytes(b"w" * 1000)

run = Path(sys.argv[1])
state = {"optimizer": torch.zeros(100_000)}  # 400 kB on disk
write_checkpoint(run, 2, model=Stub(), tokenizer=None, tensors=state, plain={"ok": 1}, config_yaml="")
# From here no file may grow past 100 kB: the weights fit, the optimizer state does not, as if
# the disk filled up half-way through the save. (Python ignores SIGXFSZ: the write raises EFBIG.)
_, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, hard))
try:
    write_checkpoint(run, 4, model=Stub(), tokenizer=None, tensors=state, plain={}, config_yaml="")
except CheckpointError as exc:
    print(json.dumps({"error": str(exc)}))
"""


def test_a_failed_save_raises_and_keeps_the_previous_checkpoint(tmp_path):
    res = subprocess.run(
        [sys.executable, "-c", DISK_FULL_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert res.returncode == 0, res.stderr
    error = json.loads(res.stdout.strip().splitlines()[-1])["error"]
    assert "step 4" in error and "File too large" in error
    assert str(checkpoints_dir(tmp_path) / "step_000002") in error  # names what is still usable
    assert [c.step for c in list_checkpoints(tmp_path)] == [2]
    assert [p.name for p in checkpoints_dir(tmp_path).iterdir()] == ["step_000002"]  # no leftovers
    tensors, plain = read_state(latest_checkpoint(tmp_path).path)
    assert plain == {"ok": 1} and torch.equal(tensors["optimizer"], torch.zeros(100_000))


def test_rng_states_round_trip_through_json_and_torch_save(tmp_path):
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    random.random(), np.random.normal(), torch.rand(1)  # move every generator off its seed
    plain, tensors = rng_state()
    (tmp_path / "p.json").write_text(json.dumps(plain))
    torch.save(tensors, tmp_path / "t.pt")
    first = (random.random(), float(np.random.normal()), torch.rand(3))
    for _ in range(5):
        random.random(), np.random.normal(), torch.rand(7)
    set_rng_state(
        json.loads((tmp_path / "p.json").read_text()),
        torch.load(tmp_path / "t.pt", weights_only=True),
    )
    again = (random.random(), float(np.random.normal()), torch.rand(3))
    assert first[0] == again[0] and first[1] == again[1]
    assert torch.equal(first[2], again[2])
