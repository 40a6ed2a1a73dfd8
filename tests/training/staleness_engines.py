"""The rollout engines of the staleness tests (tests/training/test_staleness_k.py): a "remote"
worker holding its own copy of the weights (``WorkerEngine``), a replay of recorded versions
(``ReplayEngine``), and ``install_worker``, the hook that gives a run started as its own process
(``RLVR_TEST_HOOKS=training.staleness_engines:install_worker``) the worker, with
``RLVR_TEST_GENERATE_S`` seconds added to each generation, and the probes of
``reliability.shutdown_hooks``."""

from __future__ import annotations

import copy
import os
import time

import torch

from rlvr.rollout.base import Completion, SamplingParams


@torch.no_grad()
def sample(model, tokenizer, prompt_ids: list[list[int]], params: SamplingParams):
    """``params.n`` samples per prompt at temperature ``params.temperature``, cut after EOS, from
    a generator of its own (a worker thread must not touch the trainer's global RNG)."""
    out = []
    for i, prompt in enumerate(prompt_ids):
        gen = torch.Generator().manual_seed(params.seed * 1000 + i)
        ids = torch.tensor([prompt] * params.n)
        toks, lps = [], []
        for _ in range(params.max_new_tokens):
            logits = model(input_ids=ids).logits[:, -1].float() / params.temperature
            logp = torch.log_softmax(logits, -1)
            nxt = torch.multinomial(logp.exp(), 1, generator=gen)[:, 0]
            toks.append(nxt)
            lps.append(logp.gather(1, nxt[:, None])[:, 0])
            ids = torch.cat([ids, nxt[:, None]], 1)
        group = []
        for j in range(params.n):
            row = [int(t[j]) for t in toks]
            n = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
            group.append(
                Completion(
                    prompt_index=i,
                    token_ids=row[:n],
                    logprobs=[float(lp[j]) for lp in lps[:n]],
                    text=tokenizer.decode(row[:n], skip_special_tokens=True),
                    finish_reason="stop" if n < len(row) else "length",
                )
            )
        out.append(group)
    return out


class WorkerEngine:
    """A rollout worker as the step sees a server: ``remote``, weights of its own."""

    name = "worker"
    remote = True

    def __init__(self, model, tokenizer):
        self.model = copy.deepcopy(model).eval()
        self.tokenizer = tokenizer
        self.policy_version = 0  # built from the trainer's initial weights

    def load_weights(self, named_tensors) -> None:
        self.model.load_state_dict(dict(named_tensors))

    def generate(self, prompt_ids, params: SamplingParams, vision=None):
        version = self.policy_version  # no sync lands during a generation (overlap._Gate)
        groups = sample(self.model, self.tokenizer, prompt_ids, params)
        for c in (c for g in groups for c in g):
            c.policy_version = version
        return groups

    def close(self) -> None:
        pass


class ReplayEngine:
    """An in-process engine that keeps every version pushed to it and samples the i-th batch
    from version ``tags[i]``'s weights."""

    name = "replay"

    def __init__(self, model, tokenizer, tags: list[int]):
        self.model = copy.deepcopy(model).eval()
        self.tokenizer, self.tags = tokenizer, list(tags)
        self.snapshots = {0: copy.deepcopy(self.model.state_dict())}
        self._version = 0

    @property
    def policy_version(self) -> int:
        return self._version

    @policy_version.setter
    def policy_version(self, v: int) -> None:
        self._version = v
        self.snapshots[v] = copy.deepcopy(self.model.state_dict())

    def load_weights(self, named_tensors) -> None:
        self.model.load_state_dict(dict(named_tensors))

    def generate(self, prompt_ids, params: SamplingParams, vision=None):
        tag = self.tags.pop(0)
        current = copy.deepcopy(self.model.state_dict())
        self.model.load_state_dict(self.snapshots[tag])
        groups = sample(self.model, self.tokenizer, prompt_ids, params)
        self.model.load_state_dict(current)
        for c in (c for g in groups for c in g):
            c.policy_version = tag
        return groups

    def close(self) -> None:
        pass


class SlowWorkerEngine(WorkerEngine):
    """The worker, each generation ``seconds`` longer (a slow rollout server)."""

    def __init__(self, model, tokenizer, seconds: float):
        super().__init__(model, tokenizer)
        self.seconds = seconds

    def generate(self, prompt_ids, params: SamplingParams, vision=None):
        time.sleep(self.seconds)
        return super().generate(prompt_ids, params, vision)


def install_worker() -> None:
    """The run builds a ``SlowWorkerEngine`` instead of its engine; the shutdown probes too."""
    import rlvr.training.setup as setup_mod
    from reliability.shutdown_hooks import install

    seconds = float(os.environ.get("RLVR_TEST_GENERATE_S", "0"))
    setup_mod.build_engine = lambda cfg, model, tok, *a, **k: SlowWorkerEngine(model, tok, seconds)
    install()
