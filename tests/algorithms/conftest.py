"""Shared fixtures for the algorithm tests: one CPU thread (the machine is shared)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
