"""The batch is laid out on the CPU and the forward runs where the weights are: a sequence batch
moves whole to the model's device, and a micro-batch moves what the step prepared on the CPU to
where its log-probs were computed. Checked with the meta device, which refuses to mix with CPU
tensors exactly as CUDA does (a GPU run of the same joins: tests/gpu/test_cuda_train.py)."""

from __future__ import annotations

import pytest
import torch

from rlvr.model.forward import build_sequence_batch
from rlvr.objectives.batch import MicroBatch


def test_a_sequence_batch_moves_every_tensor_it_feeds_the_model():
    sb = build_sequence_batch([[5, 6], [5, 6]], [[1, 2, 3], [4]], pad_id=0, share_prompt=True)
    moved = sb.to("meta")
    for name in ("input_ids", "attention_mask", "position_ids", "completion_ids"):
        assert getattr(moved, name).device.type == "meta", name
        assert getattr(moved, name).shape == getattr(sb, name).shape, name
    assert moved.completion_mask.device.type == "meta"
    # the rows sharing a prompt are the same rows wherever the tensors are
    assert torch.equal(moved.prompt_firsts, sb.prompt_firsts)
    assert sb.to("cpu") is sb  # nothing to move: the same batch


def test_a_micro_batch_moves_what_the_step_prepared_to_the_log_probs_device():
    logp = torch.zeros(2, 3, device="meta")
    cpu = torch.ones(2, 3)
    micro = MicroBatch(
        indices=[0, 1],
        logp=logp,
        old_logp=cpu,
        mask=cpu,
        advantages=torch.ones(2),
        entropy=logp,
        ref_logp=cpu,
        seq={"weight": torch.ones(2)},
        tok={"engine_logp": cpu, "returns": cpu},
    )
    tensors = [micro.old_logp, micro.mask, micro.advantages, micro.ref_logp]
    tensors += [*micro.seq.values(), *micro.tok.values()]
    assert all(t.device.type == "meta" for t in tensors)
    # the loss's arithmetic between them now runs (CPU with meta would raise)
    assert (micro.logp - micro.old_logp * micro.mask).device.type == "meta"
    with pytest.raises(RuntimeError, match="device"):
        _ = logp - cpu  # what an unmoved field would have met
