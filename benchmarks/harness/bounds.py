"""Each phase's physical lower bound on the machine that ran it.

A phase can go no faster than its compute at the measured matmul peak or its memory traffic at
the measured memory bandwidth, whichever is larger. The report sets every phase's median time
against its bound, so a reader sees how much of each phase is waiting on the hardware and how
much is overhead (Python, padding, kernels below peak):

- generate: every decoding step reads the weights once (in the run's precision: bf16, or
  float32 on a CPU without a bf16 fast path) plus the KV cache of the
  sequences still running; the fewest decoding steps is the longest reply of the step (all
  sequences in one batch). Bytes over bandwidth.
- update (forward + backward): 6 FLOPs per parameter per token (``stats.training_flops``).
- sync (weights pushed to an engine that holds its own copy, vLLM): the weights read once and
  written once, over bandwidth. The transformers engine shares the trained module: no sync.
- reward (Python grading) and the no-grad log-prob passes (which passes run depends on the side
  and the objective, e.g. none with one update per batch and beta 0) have no bound here.
"""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.harness.stats import quartiles, training_flops

BF16_BYTES = 2


def decode_bytes(
    weight_bytes: float,
    kv_bytes_per_token: float,
    prompt_lens: Sequence[int],
    completion_lens: Sequence[int],
) -> float:
    """Bytes an ideal engine reads to decode the sequences in one batch.

    Decoding step ``t`` (1-based) reads the weights once and, for every sequence whose reply has
    at least ``t`` tokens, the KV cache of its prompt and its first ``t - 1`` reply tokens.
    Example: weights 100, 10 bytes per cached token, prompts [2, 3], replies [1, 2]:
    step 1 reads 100 + 10*(2 + 3) = 150, step 2 reads 100 + 10*(3 + 1) = 140; total 290.
    """
    if len(prompt_lens) != len(completion_lens):
        raise ValueError(
            f"{len(prompt_lens)} prompt lengths for {len(completion_lens)} replies: "
            "one prompt length per sequence"
        )
    longest = max(completion_lens, default=0)
    total = 0.0
    for t in range(1, longest + 1):
        cached = sum(p + t - 1 for p, c in zip(prompt_lens, completion_lens, strict=True) if c >= t)
        total += weight_bytes + kv_bytes_per_token * cached
    return total


def phase_bounds(
    record: dict,
    model_info: dict,
    peak_flops: float,
    bandwidth: float,
    dtype_bytes: int = BF16_BYTES,
) -> dict:
    """Lower bounds in seconds for one step record's phases (generate, update, sync).

    ``record`` needs ``prompt_tokens`` and ``completion_tokens``; the generate bound also needs
    ``seq_prompt_lens`` and ``completion_lens`` (one per sequence) and is left out without them.
    ``model_info`` gives ``total_params``, ``nonembed_params``, ``head_params`` and
    ``kv_bytes_per_token`` (bf16 K and V of every layer for one token); ``engine`` (the worker's
    ready message) ``vllm`` adds the sync bound. ``dtype_bytes`` is the size of one weight and
    one cached key or value in the run's precision (2 for bf16, 4 for float32).
    """
    if peak_flops <= 0 or bandwidth <= 0:
        raise ValueError(f"peak_flops={peak_flops}, bandwidth={bandwidth}: both must be > 0")
    body, head = model_info["nonembed_params"], model_info["head_params"]
    prompt, comp = int(record["prompt_tokens"]), int(record["completion_tokens"])
    out = {"update": training_flops(body, head, prompt, comp) / peak_flops}
    if model_info.get("engine") == "vllm":
        out["sync"] = 2 * dtype_bytes * model_info["total_params"] / bandwidth
    if "completion_lens" in record and "seq_prompt_lens" in record:
        # the decoding weights: the body and the LM head (the embedding lookup reads a few rows)
        weights = dtype_bytes * (body + head)
        # model_info's KV bytes are bf16's (model_info.kv_bytes_per_token)
        kv = model_info.get("kv_bytes_per_token", 0) * dtype_bytes / BF16_BYTES
        out["generate"] = (
            decode_bytes(
                weights,
                kv,
                record["seq_prompt_lens"],
                record["completion_lens"],
            )
            / bandwidth
        )
    return out


BOUND_PHASES = ("generate", "update", "sync")


def bound_summary(
    measured: Sequence[dict],
    model_info: dict,
    peak_flops: float,
    bandwidth: float,
    dtype_bytes: int = BF16_BYTES,
) -> dict:
    """Per phase over the measured steps: the median bound in seconds (``phase_bound_s``) and the
    share of the phase's time the hardware needs (``phase_at_bound``: summed bounds over summed
    times, so long steps weigh in proportion; 1.0 would be a phase at its physical limit).

    A phase without a bound or without time spent is left out.
    """
    bounds = [phase_bounds(r, model_info, peak_flops, bandwidth, dtype_bytes) for r in measured]
    median_s: dict[str, float] = {}
    at_bound: dict[str, float] = {}
    for p in BOUND_PHASES:
        pairs = [
            (b[p], float(r["phases"][p]))
            for b, r in zip(bounds, measured, strict=True)
            if p in b and p in r.get("phases", {})
        ]
        spent = sum(t for _, t in pairs)
        if len(pairs) != len(measured) or not pairs or spent <= 0:
            continue
        median_s[p] = quartiles([b for b, _ in pairs])[1]
        at_bound[p] = sum(b for b, _ in pairs) / spent
    return {"phase_bound_s": median_s, "phase_at_bound": at_bound}
