"""The engine every evaluation generates with, at ``eval.dtype`` whatever the training autocast.

`rlvr eval`, `rlvr data filter-difficulty` and the in-training evaluator (before/after, scheduled,
``save_best``, the early-stop probe) all get their engine here. Greedy replies in float32 agree
between engines, while bf16 autocast changes many of them (docs/evaluation.md), so the precision
is fixed by ``eval.dtype`` and not by the CPU the run lands on.
"""

from __future__ import annotations

import torch

from rlvr.data.rows import reward_specs
from rlvr.eval.evaluator import evaluate_sets
from rlvr.eval.provenance import provenance
from rlvr.rollout.builder import build_engine, hf_engine
from rlvr.rollout.episodes import EpisodeRunner
from rlvr.rollout.hf import HFEngine

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_eval_dtype(cfg, device: torch.device | str) -> torch.dtype:
    """``eval.dtype`` in force: ``auto`` is float32 on the CPU (whatever its bf16 support),
    bfloat16 on a GPU, and bfloat16 when the weights are stored in bf16 (``model.dtype``)."""
    if cfg.model.dtype == "bfloat16":
        if cfg.eval.dtype == "float32":
            raise ValueError(
                "eval.dtype=float32 with model.dtype=bfloat16: the weights are stored in bf16; "
                "set eval.dtype=bfloat16 (or auto), or keep float32 master weights"
            )
        return DTYPES.get(cfg.eval.dtype, torch.bfloat16)
    if cfg.eval.dtype != "auto":
        return DTYPES[cfg.eval.dtype]
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def eval_batch_size(cfg) -> int:
    """Prompts per generate() call during evaluation: eval.batch_size, else rollout.batch_size."""
    return cfg.eval.batch_size or cfg.rollout.batch_size


def hf_eval_engine(
    model: torch.nn.Module, tokenizer, cfg, dtype: torch.dtype, *, synced: bool = False
) -> HFEngine:
    """An hf engine over ``model`` computing in ``dtype`` (autocast when below the weights')."""
    return hf_engine(
        cfg, model, tokenizer, dtype=dtype, batch_size=eval_batch_size(cfg), synced=synced
    )


def offline_eval_engine(cfg, model: torch.nn.Module, tokenizer):
    """The engine of `rlvr eval` / filter-difficulty: the config's engine (chosen and built by
    `rlvr.rollout.builder`, as training's is) at ``eval.dtype``."""
    dtype = resolve_eval_dtype(cfg, next(model.parameters()).device)
    return build_engine(
        cfg, model, tokenizer, autocast=False, dtype=dtype, batch_size=eval_batch_size(cfg)
    )


def training_eval_engine(cfg, engine, model: torch.nn.Module, tokenizer):
    """The engine of an in-training evaluation: the rollout vLLM engine when it already computes
    in ``eval.dtype``, else an hf engine at ``eval.dtype`` over the rollout hf engine's module
    (the trainer's own, unless a test gave the engine a copy) or, beside vLLM, over the trainer's
    ``model`` (one vLLM engine per process: a second one at another dtype cannot be opened).
    The caller syncs the rollout engine first."""
    module = engine.model if engine.name == "hf" else model
    dtype = resolve_eval_dtype(cfg, next(module.parameters()).device)
    if engine.name == "vllm" and engine.dtype == dtype:
        return engine
    # beside vLLM under FSDP2 the module is sharded: every rank must run the same forward passes
    synced = getattr(engine, "synced", False) or _sharded(module)
    return hf_eval_engine(module, tokenizer, cfg, dtype, synced=synced)


def _sharded(module: torch.nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def evaluate_config_sets(engine, tokenizer, sets: list, rewards, cfg, processor=None):
    """`evaluate_sets` with the run config's template, token limit, stop strings, seed and eval
    batch size, recording the provenance: both evaluators call this, so they cannot differ.
    ``processor``: a vision-language model's, for sets whose rows carry images. With env.name
    set, episodes over the environment with training's limits (eval.max_new_tokens, when set,
    bounds each model turn)."""

    max_new_tokens = cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
    batch_size = eval_batch_size(cfg)
    return evaluate_sets(
        engine,
        tokenizer,
        sets,
        rewards,
        template=cfg.data.template,
        system_prompt=cfg.data.system_prompt,
        max_new_tokens=max_new_tokens,
        stop=tuple(cfg.rollout.stop),
        seed=cfg.eval.seed,
        batch_size=batch_size,
        provenance=provenance(
            engine,
            cfg=cfg,
            batch_size=batch_size,
            max_new_tokens=max_new_tokens,
            grader=[s.name for s in reward_specs(cfg)],
        ),
        processor=processor,
        episodes=EpisodeRunner.from_config(cfg, tokenizer),
    )
