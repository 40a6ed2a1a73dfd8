"""Memory measurements the memory tests share: the peak of live CPU allocations while a function
runs (the profiler's allocation events)."""

from __future__ import annotations

from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile


def peak_allocated_bytes(fn) -> int:
    """Highest sum of live CPU allocations made while ``fn`` runs, from the profiler's
    allocation and free events in time order (what was allocated before does not count)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()

    def walk(events):
        for e in events:
            yield e
            yield from walk(e.children)

    tree = prof.profiler.kineto_results.experimental_event_tree()
    allocations = sorted(
        (e for e in walk(tree) if e.tag == _EventType.Allocation), key=lambda e: e.start_time_ns
    )
    live = peak = 0
    for e in allocations:
        live += e.extra_fields.alloc_size
        peak = max(peak, live)
    return peak
