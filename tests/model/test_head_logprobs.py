"""Log-probs and entropies from the hidden states a chunk at a time (model/head_logprobs.py):
numbers by hand, then the full path's values and gradients (temperature, bias, entropy bonus,
uneven chunks, autocast, a frozen head), and one chunk's memory."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from tests.training.memory_support import peak_allocated_bytes

from rlvr.model.head_logprobs import head_logprobs, plain_head
from rlvr.model.logit_transform import LogitTransform
from rlvr.training.preflight import memory_plan as mp


def _head(weight, bias=None) -> torch.nn.Linear:
    head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        head.weight.copy_(weight)
        if bias is not None:
            head.bias.copy_(bias)
    return head


def test_by_hand():
    """W = [[1, 0], [0, 1], [0, 0]], h = (ln 2, 0): logits (ln 2, 0, 0), p = (1/2, 1/4, 1/4).
    log p(0) = -ln 2; H = 1/2 ln 2 + 2 x 1/4 ln 4 = 3/2 ln 2. The gradient of log p(0) with
    respect to the logits is onehot - p = (1/2, -1/4, -1/4): through W, (1/2, -1/4) for h, and
    its outer product with h for W. At temperature 1/2 the logits are (ln 4, 0, 0):
    p = (2/3, 1/6, 1/6), log p(1) = -ln 6."""
    head = _head(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))
    h = torch.tensor([[math.log(2), 0.0]], requires_grad=True)
    logp, ent = head_logprobs(h, head, torch.tensor([0]), chunk=1)
    assert logp.item() == pytest.approx(-math.log(2), rel=1e-6)
    assert ent.item() == pytest.approx(1.5 * math.log(2), rel=1e-6)
    logp.sum().backward()
    assert torch.allclose(h.grad, torch.tensor([[0.5, -0.25]]), atol=1e-6)
    want_w = torch.tensor([[0.5], [-0.25], [-0.25]]) * torch.tensor([[math.log(2), 0.0]])
    assert torch.allclose(head.weight.grad, want_w, atol=1e-6)

    logp2, _ = head_logprobs(h.detach(), head, torch.tensor([1]), 0.5, chunk=1, entropy=False)
    assert logp2.item() == pytest.approx(-math.log(6), rel=1e-6)


def _full(h, head, labels, temperature):
    """Today's full path: the logits of every token, then log_softmax."""
    logp_all = F.log_softmax(head(h) / temperature, dim=-1)
    return logp_all.gather(-1, labels[:, None])[:, 0], -(logp_all.exp() * logp_all).sum(-1)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [False, True])
def test_values_and_gradients_equal_the_full_path(temperature, entropy_grad):
    """23 tokens in chunks of 5 (the last one short), a head with a bias; the loss weights each
    log-prob and (with the entropy bonus) each entropy differently."""
    torch.manual_seed(0)
    n, hid, vocab = 23, 16, 300
    head = torch.nn.Linear(hid, vocab)
    labels = torch.randint(0, vocab, (n,))
    w_lp, w_ent = torch.randn(n), torch.randn(n)
    grads = []
    for chunked in (True, False):
        h = torch.randn(n, hid, generator=torch.Generator().manual_seed(1), requires_grad=True)
        head.zero_grad()
        if chunked:
            logp, ent = head_logprobs(
                h, head, labels, temperature, chunk=5, entropy_grad=entropy_grad
            )
        else:
            logp, ent = _full(h, head, labels, temperature)
            if not entropy_grad:
                ent = ent.detach()
        loss = (logp * w_lp).sum() + ((ent * w_ent).sum() if entropy_grad else 0.0)
        loss.backward()
        grads.append((logp.detach(), ent.detach(), h.grad, head.weight.grad, head.bias.grad))
    for got, want in zip(*grads, strict=True):
        assert _rel(got, want) < 1e-5
    # without the entropy bonus, the entropies carry no gradient
    assert grads[0][1].requires_grad is False


def test_the_entropy_bonus_gradient_is_the_entropy_s():
    """Only an entropy term in the loss: its gradient through the chunks is dH/dh of the full
    path, and the log-probs' zero upstream gradient adds nothing."""
    torch.manual_seed(2)
    head = torch.nn.Linear(8, 50, bias=False)
    h = torch.randn(9, 8, requires_grad=True)
    labels = torch.randint(0, 50, (9,))
    _, ent = head_logprobs(h, head, labels, 0.8, chunk=4, entropy_grad=True)
    (g_chunked,) = torch.autograd.grad(ent.sum(), h)
    _, ent_full = _full(h, head, labels, 0.8)
    (g_full,) = torch.autograd.grad(ent_full.sum(), h)
    assert _rel(g_chunked, g_full) < 1e-5


def test_under_autocast_the_numbers_are_the_full_path_s():
    """bf16 autocast: the head's matmul in bf16 and the temperature division in bf16, as the
    full path does it; the log-probs match it to float32 rounding. The gradients of the hidden
    states match to bf16 rounding; the head's is each chunk's bf16 matmul summed in float32
    (the full path rounds its one matmul to bf16): both are float32's to bf16 rounding."""
    torch.manual_seed(3)
    n, hid, vocab = 20, 32, 400
    head = torch.nn.Linear(hid, vocab, bias=False)
    labels = torch.randint(0, vocab, (n,))
    h0 = torch.randn(n, hid)
    out = {}
    for name in ("chunked", "full", "fp32"):
        h = h0.clone().requires_grad_()
        head.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=name != "fp32"):
            if name == "chunked":
                logp, _ = head_logprobs(h, head, labels, 0.7, chunk=6, dtype=torch.bfloat16)
            else:
                logits = head(h)
        if name != "chunked":
            logp = F.log_softmax((logits / 0.7).float(), -1).gather(-1, labels[:, None])[:, 0]
        logp.sum().backward()
        out[name] = (logp.detach(), h.grad, head.weight.grad)
    assert _rel(out["chunked"][0], out["full"][0]) < 1e-6
    assert _rel(out["chunked"][1], out["full"][1]) < 1e-2
    assert _rel(out["chunked"][2], out["fp32"][2]) < 1e-2
    assert _rel(out["full"][2], out["fp32"][2]) < 1e-2


def test_a_model_s_transform_by_hand():
    """The head's logits (ln 2, 0, 0) times 2 (Cohere's logit_scale): (ln 4, 0, 0), so
    p = (2/3, 1/6, 1/6) and log p(0) = ln(2/3); the gradient onehot - p = (1/3, -1/6, -1/6)
    times 2 through W: (2/3, -1/3) for h. Softcapping at 1 (cap * tanh(x / cap)): the logits
    (tanh ln 2, 0, 0) = (0.6, 0, 0), log p(0) = 0.6 - ln(e^0.6 + 2), and the gradient is
    onehot - p times tanh's derivative 1 - 0.6^2 = 0.64 at the first logit (1 at the zeros)."""
    head = _head(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))
    h = torch.tensor([[math.log(2), 0.0]], requires_grad=True)
    scale = LogitTransform((("mul", 2.0),))
    logp, _ = head_logprobs(h, head, torch.tensor([0]), chunk=1, transform=scale)
    assert logp.item() == pytest.approx(math.log(2 / 3), rel=1e-6)
    logp.sum().backward()
    assert torch.allclose(h.grad, torch.tensor([[2 / 3, -1 / 3]]), atol=1e-6)

    h.grad = None
    cap = LogitTransform((("div", 1.0), ("tanh", None), ("mul", 1.0)))
    logp, _ = head_logprobs(h, head, torch.tensor([0]), chunk=1, transform=cap)
    p0 = math.exp(0.6) / (math.exp(0.6) + 2)
    assert logp.item() == pytest.approx(0.6 - math.log(math.exp(0.6) + 2), rel=1e-6)
    logp.sum().backward()
    dz = torch.tensor([(1 - p0) * 0.64, -(1 - p0) / 2, -(1 - p0) / 2])
    assert torch.allclose(h.grad, dz[None, :2], atol=1e-6)


def test_a_model_that_upcasts_its_logits_under_autocast():
    """``logits = self.lm_head(h).float()`` (Mamba, Mllama, NemotronH), then a softcap: under
    bf16 autocast the temperature divides in float32 after the upcast, as the full path does."""
    torch.manual_seed(4)
    n, hid, vocab = 12, 16, 50
    head = torch.nn.Linear(hid, vocab, bias=False)
    labels = torch.randint(0, vocab, (n,))
    h0 = torch.randn(n, hid)
    steps = LogitTransform((("float", None), ("div", 2.0), ("tanh", None), ("mul", 2.0)))
    out = {}
    for name in ("chunked", "full"):
        h = h0.clone().requires_grad_()
        head.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if name == "chunked":
                logp, _ = head_logprobs(
                    h, head, labels, 0.7, chunk=5, dtype=torch.bfloat16, transform=steps
                )
            else:
                logits = torch.tanh(head(h).float() / 2.0) * 2.0
                logp = F.log_softmax(logits / 0.7, -1).gather(-1, labels[:, None])[:, 0]
        logp.sum().backward()
        out[name] = (logp.detach(), h.grad)
    assert _rel(out["chunked"][0], out["full"][0]) < 1e-6
    assert _rel(out["chunked"][1], out["full"][1]) < 1e-2


def test_a_frozen_head_gets_no_gradient_and_the_hidden_states_the_same():
    torch.manual_seed(4)
    head = torch.nn.Linear(8, 40).requires_grad_(False)
    h = torch.randn(7, 8, requires_grad=True)
    labels = torch.randint(0, 40, (7,))
    logp, _ = head_logprobs(h, head, labels, chunk=3, entropy=False)
    (g,) = torch.autograd.grad(logp.sum(), h)
    (g_full,) = torch.autograd.grad(_full(h, head, labels, 1.0)[0].sum(), h)
    assert head.weight.grad is None and _rel(g, g_full) < 1e-5


def test_bad_shapes_and_heads():
    head = torch.nn.Linear(4, 10)
    with pytest.raises(ValueError, match="must be \\[N, H\\] and \\[N\\]"):
        head_logprobs(torch.randn(2, 3, 4), head, torch.zeros(2, 3, dtype=torch.long), chunk=4)
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        head_logprobs(torch.randn(2, 4), head, torch.zeros(2, dtype=torch.long), chunk=0)
    assert plain_head(head) and not plain_head(None) and not plain_head(torch.nn.Embedding(3, 4))


SOFTCAP = LogitTransform((("div", 3.0), ("tanh", None), ("mul", 3.0)))


@pytest.mark.parametrize("transform", [None, SOFTCAP], ids=["plain", "softcap"])
def test_one_chunk_is_alive_and_the_plan_counts_it(transform):
    """64 tokens, a 5,000-token vocabulary, chunks of 16: the forward and backward never hold
    more than one chunk's two float32 [16, 5000] buffers (plus [N, H]-sized tensors), and the
    memory plan's chunk term (CHUNK_BYTES_PER_LOGIT) is that measured peak within 10%; a
    softcapping model too (its backward recomputes the head's output for tanh's derivative
    instead of keeping a third buffer). The full path, measured the same way, holds the
    [64, 5000] logits, their log-softmax and a gradient: at least three times the full logits,
    six times the chunked peak."""
    torch.manual_seed(5)
    n, hid, vocab, chunk = 64, 16, 5000, 16
    head = torch.nn.Linear(hid, vocab, bias=False).requires_grad_(False)
    h = torch.randn(n, hid, requires_grad=True)
    labels = torch.randint(0, vocab, (n,))

    def step():
        kw = {"transform": transform} if transform else {}
        logp, _ = head_logprobs(h, head, labels, 0.9, chunk=chunk, **kw)
        logp.sum().backward()

    peak = peak_allocated_bytes(step)
    shape = mp.ModelShape(
        layers=1, hidden=hid, intermediate=1, heads=1, kv_heads=1, head_dim=hid, vocab=vocab
    )
    spec = mp.PlanSpec(
        shape=shape, micro_rows=4, prompt_tokens=1, completion_tokens=16, logprob_chunk_tokens=chunk
    )
    planned = mp.logits_bytes(spec)
    assert planned == chunk * vocab * mp.CHUNK_BYTES_PER_LOGIT
    assert 0.9 * peak <= planned <= 1.1 * peak, (planned, peak)
    full_logits = n * vocab * 4

    def full_step():
        _full(h, head, labels, 0.9)[0].sum().backward()

    assert peak < 0.6 * full_logits
    assert peak_allocated_bytes(full_step) >= 3 * full_logits
