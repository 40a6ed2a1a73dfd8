"""The memory plan set against this machine before a run: the table `rlvr preflight` and `rlvr train`
print, the fixes suggested when it does not fit, and the refusal (`memory_preflight`)."""

from __future__ import annotations

import dataclasses

from rlvr.model.loading import ModelLoadError, read_model_config
from rlvr.model.shape import shape_from_config
from rlvr.training.preflight.memory_plan import (
    GIB,
    MemoryPlan,
    PlanSpec,
    build_plan,
    full_logits_bytes,
    spec_for,
)


def _gib(n: int) -> str:
    return f"{n / GIB:7.2f} GiB"


def format_plan(plan: MemoryPlan, available: int | None = None, where: str = "") -> str:
    s = plan.spec
    kind = f"LoRA r={s.lora_rank}" if s.lora_rank else "full fine-tuning"
    par = f"{s.world_size} x {s.parallel}" if s.world_size > 1 else "1 process"
    lines = [
        f"memory plan per device ({kind}, {par}, {s.precision}; micro-batch {s.micro_rows} x "
        f"({s.prompt_tokens} + {s.completion_tokens}) tokens; {s.shape.params / 1e6:.1f}M params, "
        f"{s.trainable / 1e6:.2f}M trainable):"
    ]
    phases = {"held": plan.resident, "update": plan.update, "rollout": plan.rollout}
    for title, terms in phases.items():
        for name, n in terms.items():
            if n:
                lines.append(f"  {title:8s} {name:52s} {_gib(n)}")
    if s.logprob_chunk_tokens:  # what the chunks save: the full logits' term, not counted
        label = "(not counted) full logits, logprob_chunk_tokens=0"
        lines.append(f"  {'':8s} {label:52s} {_gib(full_logits_bytes(s))}")
    if s.engine == "server":
        label = "(not counted) rollout engine: the vLLM server's own process"
        lines.append(f"  {'':8s} {label}")
    how = "update + rollout: the CPU allocator keeps both" if s.phases_add else "larger phase"
    lines.append(f"  peak ({how}): {_gib(plan.peak).strip()}")
    if available is not None:
        verdict = "fits" if plan.peak <= available else "DOES NOT FIT"
        lines.append(f"  available{where}: {_gib(available).strip()} -> {verdict}")
    return "\n".join(lines)


def fixes(s: PlanSpec, available: int) -> list[str]:
    """Knob changes (each alone) that bring the peak under ``available``, with the new peak:
    the largest micro-batch that fits, the fewest processes, and each switch that suffices."""
    rep = dataclasses.replace
    rows = [(f"algo.micro_batch_size={r}", rep(s, micro_rows=r)) for r in range(s.micro_rows)]
    groups: list[list[tuple[str, PlanSpec]]] = [rows[:0:-1]]
    if not s.logprob_chunk_tokens:
        chunked = rep(s, logprob_chunk_tokens=1024)
        groups.append([("algo.logprob_chunk_tokens=1024", chunked)])
    if not s.gradient_checkpointing:
        groups.append([("model.gradient_checkpointing=true", rep(s, gradient_checkpointing=True))])
    if not s.lora_rank:
        targets = ("q_proj", "k_proj", "v_proj", "o_proj")
        lora = rep(s, lora_rank=16, lora_targets=targets, reference=False)
        groups.append([("model.lora.enabled=true", lora)])
    if s.vllm_here and s.engine_total_bytes and not s.engine_sleeps:
        groups.append([("rollout.sleep_during_update=true", rep(s, engine_sleeps=True))])
    if s.vllm_here:
        half = rep(
            s, kv_cache_bytes=s.kv_cache_bytes // 2, engine_total_bytes=s.engine_total_bytes // 2
        )
        groups.append([("rollout.gpu_memory_utilization halved", half)])
    worlds = [n for n in (2, 4, 8, 16, 32, 64, 128) if n > s.world_size]
    fsdp = [rep(s, world_size=n, parallel="fsdp2") for n in worlds]
    groups.append([(f"{a.world_size} processes with train.parallel=fsdp2", a) for a in fsdp])
    out = []
    for group in groups:
        for label, alt in group:
            peak = build_plan(alt).peak
            if peak <= available:
                out.append(f"{label} (peak {_gib(peak).strip()})")
                break
    return out


def memory_preflight(
    cfg, *, world_size: int = 1, echo: bool = True, prompt_tokens: int | None = None
) -> tuple[list[str], MemoryPlan | None]:
    """Print the plan (with ``echo``); return the problems that refuse the run (a GPU plan that
    cannot fit) and the plan (None when the model's shape cannot be read). ``prompt_tokens``:
    the data's longest prompt as the run sends it, where it was counted (else the plan takes
    data.max_prompt_tokens). On the CPU the processes of this machine (``LOCAL_WORLD_SIZE``,
    else ``world_size``) share its available RAM (psutil); a plan over it is a warning only."""
    import os

    import psutil
    import torch

    def say(text: str) -> None:
        if echo:
            print(text, flush=True)

    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    want = cfg.model.device
    cuda = want.startswith("cuda") or (want == "auto" and torch.cuda.is_available())
    device = "cuda" if cuda else "cpu"
    if want in ("auto", "cuda"):  # this rank's GPU, as device_for picks it
        want = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
    try:
        model_config = read_model_config(cfg.model.name_or_path)
        # a vision-language model: its language model's shape (the vision tower, a few % of a
        # Qwen2-VL's weights, is not counted)
        model_config = getattr(model_config, "get_text_config", lambda: model_config)()
        shape_from_config(model_config)  # AttributeError: not a Llama-style config
    except (AttributeError, OSError, ValueError, ModelLoadError) as exc:
        say(f"memory plan: skipped (cannot read the model's shape: {exc!r})")
        return [], None
    if device == "cuda":
        free, total = torch.cuda.mem_get_info(torch.device(want))
        available, where = free, " (free on this GPU, torch.cuda.mem_get_info)"
    else:
        vm, per = psutil.virtual_memory(), max(1, local_processes)
        total, available = int(vm.total), int(vm.available) // per
        where = " (psutil available RAM" + (f" / {per} processes)" if per > 1 else ")")
    try:
        spec = spec_for(
            cfg,
            model_config,
            world_size=world_size,
            device=device,
            device_total=total,
            prompt_tokens=prompt_tokens,
        )
    except ValueError as exc:  # vLLM's KV budget below one sequence
        return [f"memory plan: {exc}"], None
    plan = build_plan(spec)
    say(format_plan(plan, available, where))
    if plan.peak <= available:
        return [], plan
    knobs = fixes(spec, available)
    need = (
        f"the plan needs {plan.peak / GIB:.2f} GiB per device but {available / GIB:.2f} GiB is "
        "available; "
        + (f"each of these alone fits: {'; '.join(knobs)}" if knobs else "no knob alone fits")
    )
    if device == "cpu":
        say(f"memory plan warning: {need}")
        return [], plan
    return [need], plan
