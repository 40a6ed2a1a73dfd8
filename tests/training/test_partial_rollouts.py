"""rollout.partial=true: a weight push does not wait for the generation in flight
(training/overlap.py). Without vLLM: a "remote" worker in a thread of this process (as in
test_staleness_k.py) that samples token by token from weights of its own, pauses while a push
lands (``paused()``), and labels every token with the version it was sampled by, its log-prob
that of those weights on the whole sequence so far (a partial rollout recomputes its prefix on
the new weights). The push lands at a fixed token of every generation ahead (``SPLIT``): the
worker generates that many tokens, then waits for the push, which waits for them; so the
versions of every token are known in advance, and a trainer whose push waited for the
generation (no partial rollouts) would never get that far (the worker raises after its wait).
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import threading
import time

import pytest
import torch
from test_staleness import COMMON
from test_train_e2e import read_lines, tiny_config

import rlvr.training.setup as setup_mod
import rlvr.training.step as step_mod
from rlvr.config import load_config
from rlvr.config.validate import problems
from rlvr.rollout.base import Completion, SamplingParams
from rlvr.training.trainer import Trainer

SPLIT = 3  # tokens of a generation ahead sampled before the push lands
NEW = 8  # rollout.max_new_tokens
WAIT_S = 30.0


class PartialWorker:
    """A rollout worker with partial rollouts: ``paused()`` freezes its generation between two
    tokens while a push loads weights and sets the version label."""

    name = "partial-worker"
    remote = True

    def __init__(self, model, tokenizer):
        self.model = copy.deepcopy(model).eval()
        self.tokenizer = tokenizer
        self._cond = threading.Condition()
        self._version = 0  # built from the trainer's initial weights
        self._paused = False
        self._ahead: dict[int, bool] = {}  # generation ahead -> reached SPLIT
        self.pushes_during_generation = 0

    @property
    def policy_version(self) -> int:
        return self._version

    @policy_version.setter
    def policy_version(self, v: int) -> None:
        with self._cond:
            self._version = v
            self._cond.notify_all()

    def load_weights(self, named_tensors) -> None:
        with self._cond:
            if self._ahead and not self._paused:
                raise RuntimeError("a push during a generation without pausing it")
            self.model.load_state_dict(dict(named_tensors))

    @contextlib.contextmanager
    def paused(self):
        with self._cond:
            # the push lands once every generation ahead has sampled its first SPLIT tokens
            if not self._cond.wait_for(lambda: all(self._ahead.values()), timeout=WAIT_S):
                raise RuntimeError("a generation ahead never reached its split")
            self._paused = True
            self.pushes_during_generation += bool(self._ahead)
        try:
            yield
        finally:
            with self._cond:
                self._paused = False
                self._cond.notify_all()

    @torch.no_grad()
    def generate(self, prompt_ids, params: SamplingParams, vision=None):
        step = params.seed  # train.seed=0: the step's seed is its 0-based index
        key = id(params)
        with self._cond:
            start = self._version
            ahead = start < step  # requested before the update that makes version `step`
            if ahead:
                self._ahead[key] = False
        try:
            return self._sample(prompt_ids, params, key if ahead else None, start)
        finally:
            with self._cond:
                self._ahead.pop(key, None)
                self._cond.notify_all()

    def _sample(self, prompt_ids, params, key, start):
        gens = [
            torch.Generator().manual_seed(params.seed * 1000 + i) for i in range(len(prompt_ids))
        ]
        ids = [torch.tensor([p] * params.n) for p in prompt_ids]
        toks = [[] for _ in prompt_ids]  # per prompt: [n] tensors per token
        lps = [[] for _ in prompt_ids]
        versions: list[int] = []
        for t in range(params.max_new_tokens):
            with self._cond:
                if key is not None and t == SPLIT:
                    self._ahead[key] = True
                    self._cond.notify_all()
                    if not self._cond.wait_for(
                        lambda: self._version > start and not self._paused, timeout=WAIT_S
                    ):
                        raise RuntimeError("no weight push landed during the generation")
                self._cond.wait_for(lambda: not self._paused)
                versions.append(self._version)
                for i in range(len(prompt_ids)):
                    logits = self.model(input_ids=ids[i]).logits[:, -1].float() / params.temperature
                    logp = torch.log_softmax(logits, -1)
                    nxt = torch.multinomial(logp.exp(), 1, generator=gens[i])[:, 0]
                    toks[i].append(nxt)
                    lps[i].append(logp.gather(1, nxt[:, None])[:, 0])
                    ids[i] = torch.cat([ids[i], nxt[:, None]], 1)
        out = []
        eos = self.tokenizer.eos_token_id
        for i in range(len(prompt_ids)):
            group = []
            for j in range(params.n):
                row = [int(x[j]) for x in toks[i]]
                n = row.index(eos) + 1 if eos in row else len(row)
                vs = versions[:n]
                group.append(
                    Completion(
                        prompt_index=i,
                        token_ids=row[:n],
                        logprobs=[float(lp[j]) for lp in lps[i][:n]],
                        text=self.tokenizer.decode(row[:n], skip_special_tokens=True),
                        finish_reason="stop" if n < len(row) else "length",
                        policy_version=min(vs),
                        token_versions=vs if len(set(vs)) > 1 else None,
                    )
                )
            out.append(group)
        return out

    def close(self) -> None:
        pass


REAL_UPDATE = step_mod.update


def _slow_update(*args):
    time.sleep(0.3)  # the generation ahead has surely started before the push
    return REAL_UPDATE(*args)


def _cfg(model_dir, out, *extra):
    return tiny_config(
        model_dir,
        out,
        *COMMON,
        "algo.tis_cap=2",
        "train.lr=3e-3",
        f"rollout.max_new_tokens={NEW}",
        "rollout.mode=server",
        "rollout.max_staleness=1",
        "rollout.partial=true",
        *extra,
    )


def _run(cfg, monkeypatch, seen: list | None = None) -> tuple[Trainer, list[dict]]:
    """A run through the worker; ``seen`` collects, per step, what the rollout correction reads:
    the trained version, each completion's token versions, the engine and old log-probs."""
    workers: list[PartialWorker] = []

    def build(cfg, model, tok, *a, **k):
        workers.append(PartialWorker(model, tok))
        return workers[-1]

    real_prepare = step_mod.Step.prepare

    def spy(self, batch):
        if seen is not None:
            seen.append(
                (
                    self.state.policy_version,
                    [c.versions() for c in batch.completions],
                    batch.tok["engine_logp"],
                    batch.old_logp,
                )
            )
        return real_prepare(self, batch)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(setup_mod, "build_engine", build)
        mp.setattr(step_mod, "update", _slow_update)
        mp.setattr(step_mod.Step, "prepare", spy)
        trainer = Trainer(cfg)
        trainer.fit()
    trainer.workers = workers
    return trainer, [m for m in read_lines(trainer.run.run_dir) if m["step"] > 0]


def _expected(step: int, length: int) -> list[int]:
    """Step ``step``'s tokens: its first batch on the spot (version 0), every later one started
    on version step-1 and continued on version step after SPLIT tokens."""
    if step == 0:
        return [0] * length
    return [step - 1 if t < SPLIT else step for t in range(length)]


def test_a_push_lands_inside_the_generation_ahead_and_every_token_keeps_its_version(
    tiny_model_dir, tmp_path, monkeypatch
):
    seen: list = []
    trainer, lines = _run(
        _cfg(tiny_model_dir, tmp_path / "run", "train.max_steps=4"), monkeypatch, seen
    )
    assert trainer.workers[0].pushes_during_generation == 3  # after updates 0, 1, 2
    assert [v for v, *_ in seen] == [0, 1, 2, 3]
    lags = []
    for step, (trained, versions, engine_lp, old_lp) in enumerate(seen):
        assert all(v == _expected(step, len(v)) for v in versions), step
        tok_lags = [trained - x for v in versions for x in v]
        lags.append((sum(tok_lags) / len(tok_lags), max(tok_lags)))
        # the rollout correction's behaviour log-probs are each token's own engine log-prob:
        # those sampled by the trained version equal the trainer's, the older ones do not
        fresh = torch.cat(
            [
                (e - o)[torch.tensor(v) == trained]
                for v, e, o in zip(versions, engine_lp, old_lp, strict=True)
            ]
        )
        assert float(fresh.abs().max()) < 1e-4, step
        if step > 0:
            older = torch.cat([(e - o)[:SPLIT] for e, o in zip(engine_lp, old_lp, strict=True)])
            assert float(older.abs().max()) > 1e-3, step
    logged = [x for m in lines for x in (m["token_lag_mean"], m["token_lag_max"])]
    assert logged == pytest.approx([x for pair in lags for x in pair])
    assert [m["token_lag_max"] for m in lines] == [0.0, 1.0, 1.0, 1.0]
    # a reply's staleness is its oldest token's: one version behind after the first step
    assert [m["staleness_max"] for m in lines] == [0.0, 1.0, 1.0, 1.0]
    assert all(0.0 < m["token_lag_mean"] < 1.0 for m in lines[1:])
    assert all(m["time_wait_ahead"] < 1.0 for m in lines)  # the push did not wait for it


def test_a_checkpoint_with_a_partial_batch_ahead_resumes_exactly(
    tiny_model_dir, tmp_path, monkeypatch
):
    """A checkpoint after step 2 holds step 3's batch, half sampled by version 1 and half by
    version 2 (``token_versions`` in the checkpoint); a run resumed from it ends with the
    metrics and weights of the uninterrupted run."""
    extra = ("train.save_every=1", "train.max_checkpoints=3", "train.max_steps=4")
    full, lines = _run(_cfg(tiny_model_dir, tmp_path / "full", *extra), monkeypatch)
    part = tmp_path / "part"
    shutil.copytree(full.run.run_dir, part)
    for name in ("checkpoints/step_000003", "checkpoints/step_000004", "final"):
        shutil.rmtree(part / name)
    saved = json.loads((part / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    (ahead,) = saved["extra"]["lookahead"]["batches"]
    assert ahead["step"] == 2
    for grp in ahead["groups"]:
        for c in grp:
            n = len(c["token_ids"])
            assert (c["token_versions"] or [c["policy_version"]] * n) == _expected(2, n)
    resumed, _ = _run(load_config(part / "config.yaml", [f"train.resume={part}"]), monkeypatch)
    again = [m for m in read_lines(resumed.run.run_dir) if m["step"] > 0]
    keys = ("reward_mean", "policy_loss", "grad_norm", "token_lag_mean", "tis_weight_mean")
    assert [[m[k] for k in keys] for m in again] == [[m[k] for k in keys] for m in lines]
    for (n, x), (_, y) in zip(
        full.model.state_dict().items(), resumed.model.state_dict().items(), strict=True
    ):
        assert torch.equal(x, y), n


def test_partial_needs_the_server_and_a_batch_ahead():
    for extra in (["rollout.max_staleness=1"], ["rollout.mode=server"]):
        cfg = load_config(None, ["rollout.partial=true", *extra])
        assert any(
            "rollout.partial=true" in p and "rollout.mode=server" in p for p in problems(cfg)
        )
    ok = load_config(
        None, ["rollout.partial=true", "rollout.mode=server", "rollout.max_staleness=1"]
    )
    assert not [p for p in problems(ok) if "rollout.partial" in p]


def test_a_reply_spanning_a_push_keeps_each_tokens_version_from_the_servers_spans():
    from rlvr.rollout.server import parse_choice

    choice = {
        "index": 0,
        "finish_reason": "length",
        "token_ids": [4, 3, 2],
        "text": "abc",
        "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -1.0}, {"logprob": -2.0}]},
        "weight_versions": [
            {"version": "1", "start": 0, "end": 2},
            {"version": "2", "start": 2, "end": 3},
        ],
    }
    c = parse_choice(0, choice, partial=True)
    assert (c.token_versions, c.policy_version, c.logprobs) == ([1, 1, 2], 1, [-0.5, -1.0, -2.0])
    with pytest.raises(RuntimeError, match="several weight versions"):
        parse_choice(0, choice)  # without rollout.partial a push never lands in a generation
    choice["weight_versions"][1]["end"] = 2
    with pytest.raises(RuntimeError, match="unlabelled"):
        parse_choice(0, choice, partial=True)
