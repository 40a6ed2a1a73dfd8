"""The GPU tests (`-m gpu`): skipped where CUDA is absent, so CI (no GPU) stays green."""

from __future__ import annotations

import pytest
import torch
from tests.gpu.support import DEVICE


def pytest_collection_modifyitems(config, items):
    if DEVICE != "cuda" or torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: run `pytest -m gpu` on a GPU machine (docs/gpu.md)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
