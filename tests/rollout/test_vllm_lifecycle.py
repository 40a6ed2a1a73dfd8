"""Starting and stopping the engine: the trainer's process is left as it was, nothing is orphaned."""

from __future__ import annotations

import os

import psutil
import pytest
import torch

from rlvr.rollout.base import SamplingParams
from rlvr.rollout.vllm import VLLMEngine

pytestmark = pytest.mark.vllm


def test_start_keeps_trainer_threads_rng_and_set_num_threads(holder):
    holder.get()
    before, after = holder.process_state["before"], holder.process_state["after"]
    # vLLM's CPU worker sets torch to 1 thread and swaps set_num_threads for a warning no-op
    assert after["threads"] == before["threads"] == 2
    assert after["set_num_threads"] is before["set_num_threads"] is torch._C.set_num_threads
    # ...and reseeds every generator with the engine seed
    assert torch.equal(after["torch_rng"], before["torch_rng"])
    assert after["py_rng"] == before["py_rng"]


def test_second_engine_in_process_is_refused(holder, tmp_path):
    holder.get()
    with pytest.raises(RuntimeError, match="already open"):
        VLLMEngine(tmp_path)


def test_close_is_clean_and_idempotent(holder, tok):
    engine = holder.get()
    folder = engine.model_path
    assert os.path.isdir(folder)
    engine.close()
    engine.close()  # second call: no error
    assert engine.closed
    assert not os.path.exists(folder)  # the exported checkpoint is removed
    assert psutil.Process().children(recursive=True) == []
    with pytest.raises(RuntimeError, match="closed"):
        engine.generate([[5]], SamplingParams(temperature=0.0, max_new_tokens=2))
    with pytest.raises(RuntimeError, match="closed"):
        engine.load_weights([])
    # the process can start a new engine afterwards (the next test's holder.get() does)
    again = holder.get()
    assert again is not engine and not again.closed
    out = again.generate([[5, 6]], SamplingParams(temperature=0.0, max_new_tokens=2))
    assert len(out[0][0].token_ids) >= 1
