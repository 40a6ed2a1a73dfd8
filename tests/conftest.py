"""Shared fixtures: tiny random models over a character tokenizer (nothing is downloaded)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

# Toy reward functions used by end-to-end tests live in tests/toy_rewards.py; make them importable
# as `toy_rewards:...` both here and in subprocesses.
TESTS_DIR = Path(__file__).parent
sys.path.insert(0, str(TESTS_DIR))
os.environ["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# rollout.engine defaults to "auto" (vLLM when installed); tests outside tests/rollout use the
# transformers engine whatever is installed, so they behave the same with and without vLLM.
# Children get it from tests/sitecustomize.py (tests/ is on their PYTHONPATH); this process from
# the fixture below.
os.environ["RLVR_TEST_HF_ENGINE"] = "1"


@pytest.fixture(autouse=True)
def _transformers_engine_for_auto(request, monkeypatch):
    if request.node.get_closest_marker("vllm") is None:
        import rlvr.rollout.builder as run_setup

        monkeypatch.setattr(run_setup, "vllm_available", lambda: False)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from rlvr.training.tiny import save_tiny_model

    torch.set_num_threads(2)
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from rlvr.training.tiny import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory) -> Path:
    """A tiny random Qwen2-VL folder with its (image-only) processor."""
    pytest.importorskip("PIL.Image")
    from rlvr.training.tiny import save_tiny_vlm

    torch.set_num_threads(2)
    return save_tiny_vlm(tmp_path_factory.mktemp("tiny_vlm") / "model")
