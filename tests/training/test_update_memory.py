"""What the update keeps alive: the [B, Tc, V] logits are not held through the backward, and the
entropy under no gradient takes one chunk-sized temporary, not two."""

from __future__ import annotations

import torch
from memory_support import peak_allocated_bytes
from test_train_e2e import one_float32_step
from torch.multiprocessing.reductions import StorageWeakRef

from rlvr.model.logprobs import logprobs_and_entropy


def test_the_update_holds_no_logits_through_its_backward(tiny_model_dir, tmp_path, monkeypatch):
    """Every micro-batch's logits (their memory, not just the tensor object: the update reads a
    view of the model's output) are freed by the time its loss runs backward: log_softmax keeps
    its own output for the backward, so holding the logits too only raises the peak."""
    refs: list[StorageWeakRef] = []
    alive_at_backward: list[bool] = []
    backward = torch.Tensor.backward

    def watch(trainer):
        forward = trainer.run.objective.forward

        def forward_kept(model, sb):
            out = forward(model, sb)
            refs.append(StorageWeakRef(out["policy"].logits.untyped_storage()))
            return out

        monkeypatch.setattr(trainer.run.objective, "forward", forward_kept)

        def backward_watched(self, *args, **kwargs):
            alive_at_backward.append(not refs[-1].expired())
            return backward(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "backward", backward_watched)

    # micro-batches of 2 over the tiny config's 2 prompts x 4 samples: several backwards
    # the full-logits path (algo.logprob_chunk_tokens=0), the one that makes the logits
    one_float32_step(
        tiny_model_dir,
        tmp_path / "run",
        "algo.micro_batch_size=2",
        "algo.logprob_chunk_tokens=0",
        before=watch,
    )
    assert len(alive_at_backward) >= 2
    assert alive_at_backward == [False] * len(alive_at_backward)


def test_entropy_without_its_gradient_takes_one_chunk_sized_temporary():
    """Logits [4, 6, 5000] in one chunk of 4 rows (float32: 480 kB a chunk): the log-softmax
    output stays (the log-probs' backward needs it), and the entropy's exp(log p) * log p is
    formed in one more chunk-sized buffer, not two. Peak: two chunks plus small tensors."""
    torch.manual_seed(0)
    logits = torch.randn(4, 6, 5000, requires_grad=True)
    labels = torch.randint(0, 5000, (4, 6))
    chunk_bytes = 4 * 6 * 5000 * 4

    peak = peak_allocated_bytes(lambda: logprobs_and_entropy(logits, labels, chunk=4))
    assert peak < 2.5 * chunk_bytes, peak / chunk_bytes

    # the same numbers as the formula, and the log-probs' gradient is untouched by the in-place op
    lp, ent = logprobs_and_entropy(logits, labels, chunk=4)
    ref = torch.log_softmax(logits.detach(), -1)
    assert torch.equal(ent, -(ref.exp() * ref).sum(-1))
    lp.sum().backward()
    expected = torch.nn.functional.one_hot(labels, 5000).float() - ref.exp()
    assert torch.allclose(logits.grad, expected, atol=1e-6)
