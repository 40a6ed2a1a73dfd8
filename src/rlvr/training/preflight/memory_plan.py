"""The memory plan of a run, per device, before any weights load.

``build_plan`` is arithmetic over a `PlanSpec` (numbers only); ``spec_for`` reads a run config and
the model's config into one; ``memory_preflight`` prints the plan and, on a GPU, refuses one that
cannot fit, naming the knobs that would. The model is a Llama-style decoder; activations are
counted from what autograd keeps for the backward (``ACT_COEF``), the logits separately.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.model.attention import choose_attention
from rlvr.model.precision import resolve_autocast
from rlvr.model.shape import ModelShape, shape_from_config
from rlvr.model.vlm import is_vlm_config
from rlvr.objectives import build_objective
from rlvr.rollout import vllm_setup as vs
from rlvr.rollout.builder import engine_kind

GIB = 2**30
# Resident memory of the Python process itself (python, torch, transformers, the tokenizer,
# rlvr) before any weights load, measured on the CPU (docs/memory-plan.md).
CPU_BASELINE_BYTES = 420 * 2**20
# Activation bytes kept for the backward per token and decoder layer: (per hidden unit, per MLP
# unit, per attention score (x heads x sequence length, eager attention only)), by precision.
# "autocast": fp32 weights, bf16 matmuls (each linear keeps its own bf16 copy of its input; the
# norms and the residual stream stay fp32). LoRA with frozen base weights keeps fewer inputs
# (a frozen linear keeps none; only the adapters' ``lora_A`` do).
ACT_COEF: dict[tuple[str, bool], tuple[int, int, int]] = {
    ("fp32", False): (40, 16, 4),
    ("fp32", True): (24, 12, 4),
    ("autocast", False): (34, 8, 6),
    ("autocast", True): (22, 6, 6),
    ("bf16", False): (24, 8, 6),
    ("bf16", True): (18, 6, 6),
}
# Float32 [rows, vocab] tensors decoding holds at once (rollout/decode.py: the step's logits,
# their temperature-scaled copy, the softmax and its padded blocks for sampling).
DECODE_LOGIT_COPIES = 4
OPTIMIZER_TERM = "optimizer state (AdamW, 2 moments)"
HEAD_GRAD_TERM = "head gradient, float32 sum over chunks (bf16 weights)"


@dataclass(frozen=True)
class PlanSpec:
    """Every number the plan depends on."""

    shape: ModelShape
    micro_rows: int  # sequences per forward/backward pass
    prompt_tokens: int
    completion_tokens: int
    weight_bytes: int = 4  # 4: float32 weights, 2: bfloat16
    precision: str = "fp32"  # "fp32" | "autocast" (bf16 matmuls, fp32 weights) | "bf16"
    world_size: int = 1
    parallel: str = "fsdp2"  # "fsdp2" shards weights, gradients, optimizer; "ddp" replicates
    lora_rank: int = 0  # 0: full fine-tuning
    lora_targets: tuple[str, ...] | str = ()
    eager_attention: bool = True
    gradient_checkpointing: bool = False
    lean_backward: bool = False  # model.lean_backward: linears keep float32 weights, no bf16 copy
    logprob_chunk_tokens: int = 0  # algo.logprob_chunk_tokens; 0: the full logits at once
    reference: bool = False  # a separate reference model (algo.beta > 0 without LoRA)
    # rollout.builder.ENGINE_KINDS: "hf" (the transformers engine over the trainer's module),
    # "vllm" / "vllm_colocated" (an engine in this process), "server" (its own process: nothing
    # here)
    engine: str = "hf"
    engine_weight_bytes: int = 4
    kv_cache_bytes: int = 0  # vLLM: its KV budget; hf: the decoding cache
    gen_logits_bytes: int = 0  # hf: the [rows, V] fp32 logits decoding holds at once
    engine_total_bytes: int = 0  # vLLM on a GPU: its whole claim (gpu_memory_utilization x total)
    engine_sleeps: bool = False  # vLLM sleeps during the update (GPU)
    baseline_bytes: int = 0  # the process itself (CPU); 0 on a GPU
    # The CPU allocator (glibc) keeps what generation freed and, measured, the update reuses
    # little of it: on the CPU the two phases add up; on a GPU the peak is the larger phase.
    phases_add: bool = False

    @property
    def vllm_here(self) -> bool:
        """vLLM's weights and KV cache live in this process (not the server's)."""
        return self.engine in ("vllm", "vllm_colocated")

    @property
    def head_grad_accumulator(self) -> bool:
        """The chunked backward sums the head's weight gradient in a float32 ``[vocab, hidden]``
        buffer (model/head_logprobs.py), a tensor of its own beside the gradient when the
        weights are bf16 (with float32 weights it is the gradient); a LoRA policy's head is
        frozen."""
        return bool(self.logprob_chunk_tokens) and self.weight_bytes == 2 and not self.lora_rank

    @property
    def shards(self) -> int:
        return self.world_size if self.parallel == "fsdp2" and self.world_size > 1 else 1

    @property
    def seq_len(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def trainable(self) -> int:
        if self.lora_rank:
            return self.shape.lora_params(self.lora_rank, self.lora_targets)
        return self.shape.params


def activation_bytes(s: PlanSpec) -> int:
    """What the decoder layers keep for the backward in one micro-batch."""
    sh = s.shape
    lora = bool(s.lora_rank) and s.lora_targets != "all-linear"
    per_h, per_i, per_score = ACT_COEF[(s.precision, lora)]
    scores = per_score * sh.heads * s.seq_len if s.eager_attention else 0
    per_token_layer = per_h * sh.hidden + per_i * sh.intermediate + scores
    if s.lora_rank:  # each adapter keeps its rank-r intermediate
        n = len(sh.module_dims()) if s.lora_targets == "all-linear" else len(s.lora_targets)
        per_token_layer += n * s.lora_rank * (4 if s.precision == "fp32" else 2)
    tokens = s.micro_rows * s.seq_len
    if not s.gradient_checkpointing:
        return tokens * sh.layers * per_token_layer
    residual = 2 if s.precision == "bf16" else 4  # each layer keeps its input; one is recomputed
    return tokens * (sh.layers * residual * sh.hidden + per_token_layer)


def full_logits_bytes(s: PlanSpec) -> int:
    """The completion logits ``[rows, completion, vocab]`` all at once: the model's output, its
    float32 copy for the log-softmax (when the output is bf16), and their gradient (the sum
    and one chunk's full-size slice gradient)."""
    out = 4 if s.precision == "fp32" else 2
    fp32_copy = 0 if s.precision == "fp32" else 4
    return s.micro_rows * s.completion_tokens * s.shape.vocab * (out + fp32_copy + 2 * out)


# Bytes per logit of one chunk (model/head_logprobs.py): two float32 [chunk, vocab] buffers alive
# at once, log p and p, in the forward and in the backward (a bf16 matmul output lives only
# while its float32 copy is made, the bf16 gradient only after log p is freed).
CHUNK_BYTES_PER_LOGIT = 8


def logits_bytes(s: PlanSpec) -> int:
    """The log-probs' own memory: the full logits (``full_logits_bytes``) or, with
    ``logprob_chunk_tokens``, one chunk's (``CHUNK_BYTES_PER_LOGIT``) plus, under autocast with
    lean_backward, the bf16 copy of the head the chunks multiply by (autocast's own weight
    copies are counted with the other layers')."""
    if not s.logprob_chunk_tokens:
        return full_logits_bytes(s)
    positions = min(s.logprob_chunk_tokens, s.micro_rows * s.completion_tokens)
    head_copy = s.shape.vocab * s.shape.hidden * 2 if s.precision == "autocast" else 0
    return positions * s.shape.vocab * CHUNK_BYTES_PER_LOGIT + (head_copy if s.lean_backward else 0)


def logits_term(s: PlanSpec) -> str:
    """The plan's name for ``logits_bytes``."""
    if s.logprob_chunk_tokens:
        return f"logits, chunks of {s.logprob_chunk_tokens} tokens (log-softmax, fp32)"
    return "logits (log-softmax, fp32)"


@dataclass(frozen=True)
class MemoryPlan:
    resident: dict[str, int]  # held through the whole run
    update: dict[str, int]  # added during the update
    rollout: dict[str, int]  # added during generation
    spec: PlanSpec

    @property
    def update_peak(self) -> int:
        return sum(self.resident.values()) + sum(self.update.values())

    @property
    def rollout_peak(self) -> int:
        return sum(self.resident.values()) + sum(self.rollout.values())

    @property
    def peak(self) -> int:
        if self.spec.phases_add:
            return self.update_peak + sum(self.rollout.values())
        return max(self.update_peak, self.rollout_peak)

    def by_phase(self) -> dict[str, int]:
        """The plan's bytes by the part of the run that first allocates them: the start (the
        process, weights, reference, an engine held throughout), generation, and the update (the
        optimizer's moments appear at its first step). A measured run's growth in each part is
        set against these (`rlvr.training.memory`)."""
        start = {k: v for k, v in self.resident.items() if k != OPTIMIZER_TERM}
        update = sum(self.update.values()) + self.resident.get(OPTIMIZER_TERM, 0)
        return {
            "start": sum(start.values()),
            "rollout": sum(self.rollout.values()),
            "update": update,
        }

    def to_dict(self) -> dict:
        """The plan as ``summary.json`` keeps it: the peak and every term, in GiB."""
        terms = {"held": self.resident, "update": self.update, "rollout": self.rollout}
        return {
            "peak_gib": self.peak / GIB,
            "phases_add": self.spec.phases_add,
            **{k: {name: n / GIB for name, n in v.items() if n} for k, v in terms.items()},
        }


def build_plan(s: PlanSpec) -> MemoryPlan:
    """Bytes per device of each term, grouped by when they are held."""
    sh, wb = s.shape, s.weight_bytes
    base = sh.params * wb // s.shards
    adapters = s.trainable * wb if s.lora_rank else 0
    resident = {"process baseline": s.baseline_bytes, "weights": base + adapters}
    # AdamW keeps two moments per trainable parameter, in the parameter's dtype (fused: no copies)
    resident[OPTIMIZER_TERM] = 2 * s.trainable * wb // s.shards
    if s.reference:
        resident["reference model (not sharded)"] = sh.params * wb
    engine = {}
    if s.vllm_here:
        if s.engine_total_bytes:
            engine["vLLM engine (weights + KV cache)"] = s.engine_total_bytes
        else:
            engine["vLLM weights"] = sh.params * s.engine_weight_bytes
            engine["vLLM KV cache"] = s.kv_cache_bytes
    update = {"gradients": s.trainable * wb // s.shards}
    if s.parallel == "ddp" and s.world_size > 1:
        update["DDP gradient buckets"] = s.trainable * wb
    if s.shards > 1:  # FSDP2 gathers one layer and prefetches the next
        per_layer = (sh.params - sh.vocab * sh.hidden * (1 if sh.tied else 2)) // sh.layers
        update["FSDP2 gathered layers (2)"] = 2 * per_layer * wb
    if s.precision == "autocast" and not s.lean_backward:
        update["bf16 weight copies (autocast, kept for the backward)"] = sh.params * 2
    update["activations"] = activation_bytes(s)
    update[logits_term(s)] = logits_bytes(s)
    if s.head_grad_accumulator:
        update[HEAD_GRAD_TERM] = sh.vocab * sh.hidden * 4
    rollout = {}
    if s.engine == "hf":
        rollout["generation KV cache (transformers)"] = s.kv_cache_bytes
        rollout["generation logits (transformers, fp32)"] = s.gen_logits_bytes
    if s.engine_sleeps:
        rollout.update(engine)
    else:
        resident.update(engine)
    return MemoryPlan(resident, update, rollout, s)


# ----------------------------------------------------------------------------- from a run config
def spec_for(
    cfg,
    model_config,
    *,
    world_size: int,
    device: str,
    device_total: int,
    prompt_tokens: int | None = None,
) -> PlanSpec:
    """The `PlanSpec` of a run config on ``device`` ("cpu" or "cuda"), ``device_total`` bytes
    being the device's memory (RAM on the CPU): vLLM's budget is a fraction of it.

    Rows are sized at ``prompt_tokens`` (the data's longest prompt as the run sends it, where it
    was counted; else ``data.max_prompt_tokens``) plus the most tokens after it: a reply, or with
    episodes the whole episode (``Config.completion_tokens``). The engine is `engine_kind`'s:
    a vLLM engine reserves by its own context (``max_model_len_for``), the hf engine's cache
    grows with the real rows; the server's engine is another process's memory."""
    import torch

    m, a, r = cfg.model, cfg.algo, cfg.rollout
    shape = shape_from_config(model_config)
    wb = 2 if m.dtype == "bfloat16" else 4
    autocast = resolve_autocast(cfg, torch.device(device))
    precision = "bf16" if wb == 2 else ("autocast" if autocast else "fp32")
    prompt = cfg.data.max_prompt_tokens if prompt_tokens is None else prompt_tokens
    completion = cfg.completion_tokens()
    rows = a.micro_batch_size
    if a.micro_batch_tokens:
        rows = max(1, min(rows, a.micro_batch_tokens // (prompt + completion)))
    engine = engine_kind(cfg, world_size=world_size)  # as training picks it
    edtype = vs.engine_dtype(cfg, device)
    kv, total, gen_logits = 0, 0, 0
    if engine == "hf":
        per_token = vs.kv_bytes_per_token(
            model_config, torch.float32 if wb == 4 else torch.bfloat16
        )
        # the engine's context with the data's prompts in place of data.max_prompt_tokens
        max_len = vs.max_model_len_for(cfg) - cfg.data.max_prompt_tokens + prompt
        kv = r.batch_size * max_len * per_token
        # text: rollout/decode.py holds one step's [rows, V] logits (a few float32 copies);
        # image prompts, and text with rollout.hf_decoder=generate, go through
        # generate(output_logits=True), which keeps every step's
        keeps_all = is_vlm_config(model_config) or r.hf_decoder == "generate"
        steps = max_len - prompt if keeps_all else DECODE_LOGIT_COPIES
        gen_logits = r.batch_size * steps * shape.vocab * 4
    elif engine != "server" and device == "cpu":
        kv = vs.cpu_kv_cache_bytes(
            model_config,
            edtype,
            max_model_len=vs.max_model_len_for(cfg),
            max_num_seqs=vs.max_num_seqs_for(cfg),
            memory_fraction=r.gpu_memory_utilization,
            total_memory=device_total,
        )
    elif engine != "server":
        total = int(r.gpu_memory_utilization * device_total)
    lora, targets = m.lora, m.lora.target_modules
    return PlanSpec(
        shape=shape,
        micro_rows=rows,
        prompt_tokens=prompt,
        completion_tokens=completion,
        weight_bytes=wb,
        precision=precision,
        world_size=world_size,
        parallel=cfg.train.parallel,
        lora_rank=lora.rank if lora.enabled else 0,
        lora_targets=targets if isinstance(targets, str) else tuple(targets),
        eager_attention=choose_attention(m.attention, device, r.max_new_tokens) == "eager",
        gradient_checkpointing=m.gradient_checkpointing,
        lean_backward=m.lean_backward,
        logprob_chunk_tokens=a.logprob_chunk_tokens or 0,
        reference=build_objective(cfg).needs().reference and not lora.enabled,
        engine=engine,
        engine_weight_bytes=torch.empty((), dtype=edtype).element_size(),
        kv_cache_bytes=kv,
        gen_logits_bytes=gen_logits,
        engine_total_bytes=total,
        engine_sleeps=engine in ("vllm", "vllm_colocated")
        and device != "cpu"
        and r.sleep_during_update,
        baseline_bytes=CPU_BASELINE_BYTES if device == "cpu" else 0,
        phases_add=device == "cpu",
    )
