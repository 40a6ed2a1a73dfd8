"""What a run's memory really is, per step and at the end, beside the memory plan.

Per step (`MemoryMeter.end_step`): the process's resident set now and its peak so far (Linux's
VmHWM), and on a GPU torch.cuda's max allocated / max reserved since the step began (the peaks
are reset at each step's start, so each step's peak is its own) and allocated now; the engine's
KV-cache budget where the engine knows it (vLLM). With several processes each rank's figure is
``<key>_rank<r>`` and the plain key holds the maximum over ranks.

The meter also attributes every rise of the run's peak to the part of the run where it happened
(the start, generation, scoring, the update, the weight sync, between steps), so that at the end
`compare` can set the measured peak against the plan and, when the plan is far under it, name
the part whose growth the plan's terms do not cover. The measured peak is what the plan
estimates: the peak RSS on the CPU, torch.cuda's max reserved on a GPU (memory outside torch's
caching allocator, such as the CUDA context or NCCL's buffers, is in neither).
"""

from __future__ import annotations

import sys

import psutil
import torch

from rlvr.distributed import DistInfo, all_gather_objects
from rlvr.training.preflight.memory_plan import MemoryPlan

GIB = 2**30
# The plan is a lower bound; a measured peak more than this far above it gets a warning.
WARN_OVER_PLAN = 0.25
# The step's timed phases (training/step.py) by the part of the run the plan groups them in.
PHASE_PARTS = {
    "time_rollout": "rollout",
    "time_reward": "reward",
    "time_logprobs": "update",
    "time_reference": "update",
    "time_prepare": "update",
    "time_update": "update",
    "time_sync": "sync",
}
# What the plan does not count, by the part of the run where a peak beyond it grew.
MISSING = {
    "start": "what loads before the first step beyond the planned weights, reference and engine "
    "(libraries, a reward model, the model's buffers)",
    "rollout": "generation beyond one batch's KV cache and one decoding step's logits (a batch "
    "generated ahead, several dynamic-sampling rounds, vLLM's own buffers)",
    "reward": "rewards scored in the trainer process (a PRM's model, a reward's own buffers): "
    "the plan counts no reward memory",
    "update": "what the allocator keeps between the update's micro-batches and steps beyond one "
    "micro-batch's activations and logits (on a GPU: the caching allocator's fragmentation)",
    "sync": "the weight sync (full weights gathered or copied for the engine)",
    "between": "evaluation and checkpoints between steps (the eval engine at eval.dtype, a "
    "gathered state dict): the plan counts neither",
}


def peak_rss_bytes() -> int:
    """The process's peak resident set so far: Linux's VmHWM; elsewhere getrusage's ru_maxrss
    (bytes on macOS, KiB on the other Unixes)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource  # Unix only; Linux answers above

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class MemoryMeter:
    """Reads this process's memory around each step (every rank calls it: the reading is
    gathered over ranks) and keeps the run's peak with where it grew."""

    def __init__(self, device: torch.device, dist: DistInfo, engine: object = None) -> None:
        self.cuda = device.type == "cuda"
        self.device, self.dist, self.engine = device, dist, engine
        self._proc = psutil.Process()
        self.peak = 0  # the run's peak so far in this process (bytes; see `measure`)
        self.growth: dict[str, int] = {}  # rises of `peak`, by part of the run
        self._note("start")

    @property
    def measure(self) -> str:
        """What `peak` measures."""
        return "torch.cuda max reserved" if self.cuda else "peak RSS"

    def _device_peak(self) -> int:
        if self.cuda:
            return int(torch.cuda.max_memory_reserved(self.device))
        return peak_rss_bytes()

    def _note(self, part: str) -> None:
        now = self._device_peak()
        if now > self.peak:
            self.growth[part] = self.growth.get(part, 0) + now - self.peak
            self.peak = now

    def phase(self, name: str) -> None:
        """After a timed phase of the step (``time_rollout`` ...): book the peak's rise to it."""
        self._note(PHASE_PARTS.get(name, "between"))

    def begin_step(self) -> None:
        """Book what grew since the last step (evaluation, checkpoints) and start the step's
        own CUDA peaks."""
        self._note("between")
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def end_step(self) -> dict[str, float]:
        """The step's memory metrics (GiB), gathered over ranks."""
        self._note("between")
        mine = {
            "mem_rss_gib": self._proc.memory_info().rss / GIB,
            "mem_rss_peak_gib": peak_rss_bytes() / GIB,
        }
        if self.cuda:
            mine.update(
                mem_cuda_max_allocated_gib=torch.cuda.max_memory_allocated(self.device) / GIB,
                mem_cuda_max_reserved_gib=torch.cuda.max_memory_reserved(self.device) / GIB,
                mem_cuda_allocated_gib=torch.cuda.memory_allocated(self.device) / GIB,
            )
        ranks = all_gather_objects(mine, self.dist)
        out = {key: max(r[key] for r in ranks) for key in mine}
        if self.dist.enabled:
            for rank, r in enumerate(ranks):
                out.update({f"{key}_rank{rank}": v for key, v in r.items()})
        kv = getattr(self.engine, "kv_cache_bytes", None)  # vLLM's budget; None where unknown
        if kv:
            out["mem_engine_kv_gib"] = kv / GIB
        return out

    def finish(self) -> dict:
        """The run's measured peak (the maximum over ranks) and where it grew on that rank."""
        self._note("between")
        ranks = all_gather_objects((self.peak, self.growth), self.dist)
        rank = max(range(len(ranks)), key=lambda r: ranks[r][0])
        peak, growth = ranks[rank]
        over = f", max over {len(ranks)} processes (rank {rank})" if len(ranks) > 1 else ""
        return {
            "measured_peak_gib": peak / GIB,
            "measure": f"{self.measure}{over}",
            "growth_gib": {part: n / GIB for part, n in growth.items()},
        }


def compare(plan: MemoryPlan | None, measured: dict) -> dict:
    """``summary.json``'s ``memory``: the measured peak (`MemoryMeter.finish`) against the
    plan, the plan's error ``(plan - measured) / measured`` (negative: the plan is under), and a
    warning naming the likely missing term when the measured peak is more than
    ``WARN_OVER_PLAN`` above the plan."""
    out = dict(measured)
    if plan is None:
        return out
    planned, peak = plan.peak / GIB, measured["measured_peak_gib"]
    out.update(plan_peak_gib=planned, error=(planned - peak) / peak, warning=None)
    if peak > (1 + WARN_OVER_PLAN) * planned:
        budget = {part: n / GIB for part, n in plan.by_phase().items()}
        excess = {p: g - budget.get(p, 0.0) for p, g in measured["growth_gib"].items()}
        part = max(excess, key=excess.__getitem__)
        out["likely_missing"] = part
        out["warning"] = (
            f"the measured peak is {peak / planned - 1:.0%} above the plan (more than "
            f"{WARN_OVER_PLAN:.0%}; the plan is a lower bound); likely missing: {MISSING[part]} "
            f"(the peak rose {excess[part]:.3f} GiB more in the part '{part}' than the plan's "
            "terms for it)"
        )
    return out


def memory_lines(mem: dict) -> list[str]:
    """The closing lines of `rlvr train` about memory (``summary.json``'s ``memory``)."""
    head = f"memory: measured peak {mem['measured_peak_gib']:.3f} GiB ({mem['measure']})"
    if "plan_peak_gib" not in mem:
        return [f"{head}; no memory plan (a model passed in, or its shape unreadable)"]
    error = mem["error"]
    why = (
        "it sizes every row at data.max_prompt_tokens + rollout.max_new_tokens; shorter rows "
        "need less"
        if error >= 0
        else "the plan is a lower bound, within about 20% on the CPU"
    )
    lines = [
        f"{head} against {mem['plan_peak_gib']:.3f} GiB planned before the run: the plan is "
        f"{abs(error):.1%} {'above' if error >= 0 else 'under'} the measured peak ({why}; "
        "docs/memory-plan.md)"
    ]
    if mem.get("warning"):
        lines.append(f"memory warning: {mem['warning']}")
    return lines
