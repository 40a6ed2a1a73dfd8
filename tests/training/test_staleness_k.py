"""rollout.max_staleness=k up to 4: the batches of the next k steps are requested ahead
(training/overlap.py). A planted slow trainer and a fast rollout worker without vLLM: a "remote"
engine (``remote = True``, so the step generates in a background thread) holding its own copy of
the weights, which only a sync changes, and labelling each completion with the version it was
last synced to. The versions each step trains on are predicted exactly, batches more than k
behind are dropped and counted, and the final weights equal those of a reference run that
trains on-policy step by step but samples each step's batch from a snapshot of the weights of
the version the pipeline recorded for it: a batch fed at the wrong step, or sampled by other
weights than its label says, changes the weights."""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest
import torch
from staleness_engines import ReplayEngine, WorkerEngine
from test_staleness import COMMON
from test_train_e2e import read_lines, tiny_config

import rlvr.training.setup as setup_mod
import rlvr.training.step as step_mod
from rlvr.config import ConfigError, load_config
from rlvr.config.env import env_problems
from rlvr.training.trainer import Trainer

SLOW_UPDATE_S = 1.0  # the planted slow trainer; the worker samples a batch in < 0.1 s


REAL_UPDATE = step_mod.update


def _slow_update(*args):
    time.sleep(SLOW_UPDATE_S)
    return REAL_UPDATE(*args)


def _engine(monkeypatch, make) -> None:
    monkeypatch.setattr(
        setup_mod, "build_engine", lambda cfg, model, tok, *a, **k: make(model, tok)
    )


def _cfg(model_dir, out, *extra):
    return tiny_config(
        model_dir, out, *COMMON, "algo.tis_cap=2", "train.lr=3e-3", "train.max_steps=6", *extra
    )


def _run(cfg, slow: bool = False) -> tuple[Trainer, list[dict]]:
    with pytest.MonkeyPatch.context() as mp:
        if slow:
            mp.setattr(step_mod, "update", _slow_update)
        trainer = Trainer(cfg)
        trainer.fit()
    return trainer, [m for m in read_lines(trainer.run.run_dir) if m["step"] > 0]


def _tags(lines: list[dict]) -> list[int]:
    """The version that sampled each step's batch (one version per batch: mean == max)."""
    assert all(m["staleness_mean"] == m["staleness_max"] for m in lines)
    # policy_version is logged after the step's update: the trained version is one less
    return [int(m["policy_version"] - 1 - m["staleness_max"]) for m in lines]


def _replayed(monkeypatch, model_dir, out, tags: list[int]) -> Trainer:
    """The reference: on-policy step by step (max_staleness 0, every version pushed), each
    step's batch sampled by the weights of the version the pipeline recorded for it."""
    _engine(monkeypatch, lambda model, tok: ReplayEngine(model, tok, tags))
    trainer, lines = _run(_cfg(model_dir, out))
    assert [m["staleness_max"] for m in lines] == [s - t for s, t in enumerate(tags)]
    return trainer


def _same_weights(a: Trainer, b: Trainer) -> None:
    for (n, x), (_, y) in zip(
        a.model.state_dict().items(), b.model.state_dict().items(), strict=True
    ):
        assert torch.equal(x, y), n


def test_two_ahead_trains_versions_within_two_and_equals_the_replayed_reference(
    tiny_model_dir, tmp_path, monkeypatch
):
    """k=2, 6 steps (0-based here; metrics.jsonl logs step s as s + 1), a worker much faster
    than the trainer: steps 1 and 2 train the batches requested at step 0 (version 0), then step
    s trains the batch version s-2 sampled as soon as it was requested, during step s-2: sampling
    versions 0,0,0,1,2,3, staleness 0,1,2,2,2,2, nothing dropped. The weights equal the replayed reference bitwise."""
    _engine(monkeypatch, WorkerEngine)
    piped, lines = _run(
        _cfg(tiny_model_dir, tmp_path / "piped", "rollout.max_staleness=2"), slow=True
    )
    assert [m["staleness_max"] for m in lines] == [0.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    tags = _tags(lines)
    assert tags == [0, 0, 0, 1, 2, 3]
    assert [m["stale_dropped"] for m in lines] == [0.0] * 6
    assert all(m["logprob_diff_max"] > 1e-3 for m in lines[1:])  # truly stale log-probs
    assert lines[0]["logprob_diff_max"] < 1e-4
    ref = _replayed(monkeypatch, tiny_model_dir, tmp_path / "ref", tags)
    _same_weights(piped, ref)
    # and the tags matter: replaying one step from the wrong version ends elsewhere
    wrong = _replayed(monkeypatch, tiny_model_dir, tmp_path / "wrong", [0, 0, 0, 1, 1, 3])
    with pytest.raises(AssertionError):
        _same_weights(piped, wrong)


def test_a_batch_beyond_k_is_dropped_counted_and_regenerated_on_current_weights(
    tiny_model_dir, tmp_path, monkeypatch
):
    """k=2 with rollout.sync_every=2 (pushes after updates 2 and 4 only; steps 0-based): step
    3's batch was requested at step 1 when the engine still held version 0, so at step 3 it is 3
    versions behind: dropped (stale_dropped 1, its 8 sequences counted) and sampled again after pushing
    version 3 (staleness 0). Step 4's batch, requested after the push of version 2, and step
    5's, requested after the regeneration's push of version 3, are 2 behind: kept. The weights
    equal the reference that replays versions 0,0,0,3,2,3."""
    _engine(monkeypatch, WorkerEngine)
    extra = ("rollout.max_staleness=2", "rollout.sync_every=2")
    piped, lines = _run(_cfg(tiny_model_dir, tmp_path / "piped", *extra), slow=True)
    assert [m["stale_dropped"] for m in lines] == [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert [m["stale_dropped_seqs"] for m in lines] == [0.0, 0.0, 0.0, 8.0, 0.0, 0.0]
    assert [m["staleness_max"] for m in lines] == [0.0, 1.0, 2.0, 0.0, 2.0, 2.0]
    assert max(m["staleness_max"] for m in lines) <= 2
    tags = _tags(lines)
    assert tags == [0, 0, 0, 3, 2, 3]
    _same_weights(piped, _replayed(monkeypatch, tiny_model_dir, tmp_path / "ref", tags))


def test_two_ahead_resumes_on_the_batches_ahead_and_ends_as_the_uninterrupted_run(
    tiny_model_dir, tmp_path, monkeypatch
):
    """k=2 through the worker, a checkpoint every step: the one after step 3 holds the batches
    of steps 4 and 5 (0-based 3 and 4) sampled by versions 1 and 2. A run resumed from it trains
    them and ends with the weights and metrics of the uninterrupted run."""
    _engine(monkeypatch, WorkerEngine)
    extra = ("rollout.max_staleness=2", "train.save_every=1", "train.max_checkpoints=3")
    extra += ("train.max_steps=5",)
    full, lines = _run(_cfg(tiny_model_dir, tmp_path / "full", *extra), slow=True)
    part = tmp_path / "part"
    shutil.copytree(full.run.run_dir, part)
    for name in ("checkpoints/step_000004", "checkpoints/step_000005", "final"):
        shutil.rmtree(part / name)
    saved = json.loads((part / "checkpoints" / "step_000003" / "trainer_state.json").read_text())
    ahead = saved["extra"]["lookahead"]["batches"]
    assert [b["step"] for b in ahead] == [3, 4]
    assert [{c["policy_version"] for g in b["groups"] for c in g} for b in ahead] == [{1}, {2}]
    resumed = Trainer(load_config(part / "config.yaml", [f"train.resume={part}"]))
    resumed.fit()
    again = [m for m in read_lines(resumed.run.run_dir) if m["step"] > 0]
    keys = ("reward_mean", "policy_loss", "grad_norm", "staleness_max", "tis_weight_mean")
    assert [[m[k] for k in keys] for m in again] == [[m[k] for k in keys] for m in lines]
    _same_weights(full, resumed)


def test_colocated_engine_emulates_k_ahead_in_order(tiny_model_dir, tmp_path):
    """The hf engine generates each batch ahead at its request, in the trainer's thread: with
    k=3 the lag of a 3-deep pipeline, exactly (staleness 0,1,2,3,3), and nothing dropped."""
    cfg = tiny_config(
        tiny_model_dir,
        tmp_path,
        *COMMON,
        "rollout.max_staleness=3",
        "algo.tis_cap=2",
        "train.max_steps=5",
    )
    trainer = Trainer(cfg)
    trainer.fit()
    lines = [m for m in read_lines(trainer.run.run_dir) if m["step"] > 0]
    assert [m["staleness_max"] for m in lines] == [0.0, 1.0, 2.0, 3.0, 3.0]
    assert [m["stale_dropped"] for m in lines] == [0.0] * 5


def test_the_bound_and_the_refusals_name_the_knob(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"rollout\.max_staleness.*less than or equal to 4"):
        load_config(None, ["rollout.max_staleness=5"])
    cfg = load_config(None, ["rollout.max_staleness=3", "env.name=calculator"])
    assert any("rollout.max_staleness=3 with env.name" in p for p in env_problems(cfg))


def test_a_stop_signal_keeps_the_finished_batches_ahead_only_and_resumes_exactly(
    tiny_model_dir, tmp_path, monkeypatch
):
    """k=3 through the worker, each generation 1 s (planted), ``rlvr train`` in a process of its
    own: SIGTERM in the update of step 2 (1-based), whose batches ahead (0-based steps 2-4) are
    then queued or being generated. The checkpoint of step 2 is complete less than
    ``train.stop_grace_s`` (2 s) after the signal (the checkpoint's COMPLETE marker against the
    signal's time): it holds the finished batches ahead only (no wait for the others, which would
    take up to 3 s), and the prompt sampler from before the first batch it dropped. The resumed
    run generates the dropped batches again from the same prompts and seeds, so its weights equal
    those of the reference replaying the versions it recorded: a batch lost, or drawn from the
    wrong prompts (the sampler not rewound), changes them."""
    import os
    import signal
    import subprocess
    import sys

    from reliability.procs import wait_for
    from rlvr.checkpoint.full import latest_checkpoint, read_state

    grace = 2.0
    run_dir = tmp_path / "stop"
    cfg = _cfg(tiny_model_dir, tmp_path, "rollout.max_staleness=3", "train.run_name=stop")
    (tmp_path / "run.yaml").write_text(cfg.to_yaml())
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "RLVR_TEST_HOOKS": "training.staleness_engines:install_worker",
        "RLVR_TEST_GENERATE_S": "1",
        "RLVR_TEST_PAUSE_IN": "update",
        "RLVR_TEST_PAUSE_S": "0.2",
        "RLVR_TEST_RUN_DIR": str(run_dir),
    }
    cmd = [sys.executable, "-m", "rlvr", "train", "-c", str(tmp_path / "run.yaml")]
    cmd.append(f"train.stop_grace_s={grace:g}")
    log = tmp_path / "log.txt"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        assert wait_for((tmp_path / "in_update").exists, proc.pid, 300), log.read_text()[-3000:]
        sent = time.time()
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(120) == 4, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    latest = latest_checkpoint(run_dir)
    assert latest is not None and latest.step == 2, log.read_text()[-3000:]
    took = (latest.path / "COMPLETE").stat().st_mtime - sent
    print(f"checkpoint {took:.2f} s after the signal")
    assert took < grace, f"checkpoint {took:.2f} s after the signal"
    kept = [b["step"] for b in read_state(latest.path)[1]["extra"]["lookahead"]["batches"]]
    assert kept == list(range(2, 2 + len(kept))) and len(kept) < 3, kept  # some were dropped

    _engine(monkeypatch, WorkerEngine)
    resumed = Trainer(load_config(run_dir / "config.yaml", [f"train.resume={run_dir}"]))
    resumed.fit()
    lines = [m for m in read_lines(run_dir) if m["step"] > 0]
    assert [m["step"] for m in lines] == [1, 2, 3, 4, 5, 6]
    assert max(m["staleness_max"] for m in lines) <= 3
    ref = _replayed(monkeypatch, tiny_model_dir, tmp_path / "ref", _tags(lines))
    _same_weights(resumed, ref)


def test_a_batch_ahead_with_episodes_and_images_comes_back_from_a_checkpoint_equal():
    """The checkpoint of a batch generated ahead (JSON) keeps an episode's ``EpisodeInfo`` (its
    transcript's turns as tuples) and a vision-language prompt's images and processor tensors
    (bf16 and int64), bit for bit; it lost both before (the episode came back a dict, the vision
    inputs None)."""
    import numpy as np
    from PIL import Image

    from rlvr.data.multimodal import PromptVision
    from rlvr.objectives.batch import RolloutBatch
    from rlvr.rollout.base import Completion, EpisodeInfo
    from rlvr.training.overlap import Lookahead

    gen = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (5, 7, 3), dtype=torch.uint8, generator=gen).numpy()
    vision = [
        PromptVision(
            images=[Image.fromarray(pixels, "RGB")],
            inputs={
                "pixel_values": torch.randn(4, 6, generator=gen).to(torch.bfloat16),
                "image_grid_thw": torch.tensor([[1, 2, 2]]),
            },
        )
    ]
    episode = EpisodeInfo(
        turns=2,
        tool_calls=1,
        env_reward=0.5,
        gives_reward=True,
        model_tokens=3,
        env_tokens=2,
        final_text="42",
        transcript=[("model", "calc 6*7"), ("env", "42"), ("model", "42")],
    )
    completion = Completion(
        0,
        [5, 6, 7, 8, 9],
        [-0.5, -1.25, 0.0, 0.0, -0.125],
        "x",
        "stop",
        3,
        [1, 1, 0, 0, 1],
        episode,
    )
    batch = RolloutBatch(
        [{"prompt": "p", "answer": "42"}], ["p"], [[1, 2, 3]], [[completion]], 1, vision=vision
    )
    ahead = Lookahead(depth=1, background=False)
    ahead.start(4, lambda: batch)
    state, sampler = ahead.state_dict()
    assert sampler is None
    again = Lookahead(depth=1, background=False)
    again.load_state_dict(json.loads(json.dumps(state)))  # as the checkpoint writes and reads it
    back = again.take(4)
    assert back.completions == batch.completions
    assert isinstance(back.completions[0].episode, EpisodeInfo)
    assert (back.rows, back.prompt_texts, back.prompt_ids) == (
        ["p"] and batch.rows,
        ["p"],
        [[1, 2, 3]],
    )
    (v,) = back.vision
    assert v.images[0].mode == "RGB" and np.array_equal(np.asarray(v.images[0]), pixels)
    for key, t in vision[0].inputs.items():
        assert v.inputs[key].dtype == t.dtype and torch.equal(v.inputs[key], t), key


class _AbortableWorker(WorkerEngine):
    """A rollout server whose generations ahead take ``LONG_S`` (long replies) unless aborted
    (``abort_generations``: vLLM's /abort_requests), and then fail as vLLM's aborted replies do."""

    LONG_S = 30.0

    def __init__(self, model, tokenizer):
        super().__init__(model, tokenizer)
        self.aborted = threading.Event()
        self.calls = 0

    def generate(self, prompt_ids, params, vision=None):
        self.calls += 1
        if self.calls > 1 and self.aborted.wait(self.LONG_S):  # a batch ahead
            raise RuntimeError("the rollout server finished with 'abort'")
        return super().generate(prompt_ids, params, vision)

    def abort_generations(self) -> None:
        self.aborted.set()


def test_a_stop_signal_does_not_wait_for_the_generation_running_ahead(
    tiny_model_dir, tmp_path, monkeypatch
):
    """SIGTERM in the update of step 1 of a k=1 run whose batch ahead takes 30 s: the stop's
    checkpoint keeps only the finished batches (none), and the run must then end, not wait for
    the generation still running on the server (the cluster's SIGKILL would come first, and exit
    code 137 instead of 4 reads as a failure): the engine's generations in flight are aborted."""
    import os
    import signal

    from rlvr.training.preempt import Preempted

    engines: list[_AbortableWorker] = []

    def build(cfg, model, tok, *a, **k):
        engines.append(_AbortableWorker(model, tok))
        return engines[-1]

    monkeypatch.setattr(setup_mod, "build_engine", build)
    sent: list[float] = []

    def update_then_stop(*args):
        out = REAL_UPDATE(*args)
        if not sent:
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(step_mod, "update", update_then_stop)
    cfg = _cfg(tiny_model_dir, tmp_path, "rollout.max_staleness=1", "train.stop_grace_s=2")
    trainer = Trainer(cfg)
    with pytest.raises(Preempted):
        trainer.fit()
    took = time.monotonic() - sent[0]
    assert took < 10, f"the run ended {took:.1f} s after the signal"
    assert engines[0].aborted.is_set()
    status = json.loads((trainer.run.run_dir / "status.json").read_text())
    assert status["state"] == "preempted" and status["step"] == 1
