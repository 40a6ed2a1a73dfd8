"""Completions without padding: the packed layout by hand, log-probs read from packed logits
by hand, and a training step that puts exactly the replies' tokens through the model."""

from __future__ import annotations

import math

import pytest
import torch
from test_shared_prompt import record_positions
from tests.training.test_train_e2e import one_float32_step

from rlvr.model.attention import GROUPED_EAGER, PACKED_SDPA
from rlvr.model.forward import build_sequence_batch
from rlvr.model.logprobs import completion_logprobs
from rlvr.model.packed_rows import PackedRows


def test_pack_and_unpack_place_each_position_by_hand():
    real = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    rows = PackedRows.from_mask(real)
    assert rows.flat.tolist() == [0, 1, 6, 9, 10, 11] and rows.size == 6
    x = torch.arange(12.0).view(4, 3) + 1  # 1..12, row by row
    packed = rows.pack(x)
    assert packed.tolist() == [1.0, 2.0, 7.0, 10.0, 11.0, 12.0]
    back = rows.unpack(packed)
    assert back.tolist() == [[1, 2, 0], [0, 0, 0], [7, 0, 0], [10, 11, 12]]
    # attention inputs [1, heads, N, D] -> [rows, heads, width, D], and back
    heads = torch.arange(6.0).view(1, 1, 6, 1).expand(1, 2, 6, 1) * torch.tensor([1.0, -1.0]).view(
        1, 2, 1, 1
    )
    laid = rows.unpack_heads(heads)
    assert laid.shape == (4, 2, 3, 1)
    assert laid[3, 1, :, 0].tolist() == [-3.0, -4.0, -5.0] and laid[1].abs().sum() == 0
    again = rows.pack_output(laid.transpose(1, 2))  # the attention's output layout [B, T, H, D]
    torch.testing.assert_close(again, heads.transpose(1, 2), rtol=0, atol=0)


def test_completion_logprobs_read_packed_logits_by_hand():
    """Two rows, replies of 2 and 1 tokens: three rows of logits over four tokens whose
    softmaxes are [1,1,2,4]/8, uniform, and [1,2,3,2]/8."""
    sb = build_sequence_batch([[5, 6], [5, 6]], [[3, 0], [2]], pad_id=1)
    logits = torch.log(torch.tensor([[1.0, 1, 2, 4], [1, 1, 1, 1], [1, 2, 3, 2]]))
    logits.requires_grad_(True)
    logp, ent = completion_logprobs(logits, sb)
    expected = torch.tensor([[math.log(4 / 8), math.log(1 / 4)], [math.log(3 / 8), 0.0]])
    torch.testing.assert_close(logp, expected)
    ln2 = math.log(2)
    # sum of p * log2(1/p): 3/8 + 3/8 + 2/4 + 1/2 bits; 2 bits; 3/8 + 2/4 + 2/4 + 3/8 * log2(8/3)
    h2 = (3 / 8 + 1 + 3 / 8 * math.log2(8 / 3)) * ln2
    torch.testing.assert_close(ent, torch.tensor([[1.75 * ln2, 2 * ln2], [h2, 0.0]]))
    logp.sum().backward()
    # d log p(label) / d logits = onehot(label) - p
    torch.testing.assert_close(logits.grad[0], torch.tensor([-1 / 8, -1 / 8, -2 / 8, 4 / 8]))
    torch.testing.assert_close(logits.grad[2], torch.tensor([-1 / 8, -2 / 8, 5 / 8, -2 / 8]))
    # temperature 2 halves the logits: uniform stays uniform, [1,1,2,4] becomes [1,1,√2,2]
    logp2, _ = completion_logprobs(logits.detach(), sb, 2.0, entropy=False)
    z = 2 + math.sqrt(2) + 2
    assert logp2[0, 0].item() == pytest.approx(math.log(2 / z), abs=1e-6)
    assert logp2[0, 1].item() == pytest.approx(math.log(1 / 4), abs=1e-6)
    with pytest.raises(ValueError, match="packed logits .* for 3 completion tokens"):
        completion_logprobs(logits.detach()[:2], sb)


@pytest.mark.parametrize("attention", ["auto", "sdpa"])
def test_a_training_step_puts_exactly_the_replies_tokens_through_the_model(
    tiny_model_dir, tmp_path, attention
):
    """Under the default CPU attention a step's update runs each micro-batch's replies packed:
    one row of exactly their tokens (no padding), and the whole step's packed positions add
    up to the batch's reply tokens."""
    held = {}

    def watch(trainer):
        held["trainer"] = trainer
        return record_positions(trainer.model)

    metrics, _, seen = one_float32_step(
        tiny_model_dir,
        tmp_path,
        "algo.group_size=4",
        "algo.prompts_per_step=4",
        "algo.micro_batch_size=4",
        f"model.attention={attention}",
        before=watch,
    )
    assert metrics["grad_norm"] > 0
    # auto is the grouped eager attention on the CPU; sdpa (the GPU's) packs as well
    want = {"auto": GROUPED_EAGER, "sdpa": PACKED_SDPA}[attention]
    assert held["trainer"].model.config._attn_implementation == want
    batch = held["trainer"].last_batch
    lens = [len(c) for c in batch.comp_ids]
    # the update's passes come last, two per micro-batch (one group each): its prompt but the
    # last token once (one row), then its replies packed into one row of exactly their tokens
    update = seen[-8:]
    assert all(rows == 1 for rows, _ in update)
    heads = [len(batch.seq_prompt_ids[g * 4]) - 1 for g in range(4)]
    assert sorted(t for _, t in update[0::2]) == sorted(heads)
    assert sorted(t for _, t in update[1::2]) == sorted(
        sum(lens[g * 4 : g * 4 + 4]) for g in range(4)
    )
    assert max(lens) > min(lens)  # padding there was to leave out
