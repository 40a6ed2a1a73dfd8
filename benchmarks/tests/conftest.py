"""Benchmark tests run on one thread: the machine is shared and these check logic, not speed."""

from __future__ import annotations

import torch

torch.set_num_threads(1)
