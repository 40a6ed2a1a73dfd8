"""Fixtures of the eval tests: a tiny model whose greedy answers differ between prompts, and the
toy reward module `eval_toy_rewards` (importable here and in subprocesses)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

EVAL_TESTS_DIR = Path(__file__).parent
sys.path.insert(0, str(EVAL_TESTS_DIR))
os.environ["PYTHONPATH"] = os.pathsep.join([str(EVAL_TESTS_DIR), os.environ.get("PYTHONPATH", "")])


@pytest.fixture(scope="session")
def sharp_model_dir(tmp_path_factory) -> Path:
    """A tiny random model with its weights scaled up 20x.

    At the usual init scale the logits are almost flat and greedy decoding prints the same
    token for every prompt ("????????"), so comparing two evaluations would compare nothing.
    Scaled up, the greedy responses differ from prompt to prompt.
    """
    from rlvr.training.tiny import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.mul_(20.0)
    out = tmp_path_factory.mktemp("sharp") / "model"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
