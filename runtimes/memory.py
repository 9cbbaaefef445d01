"""Peak memory of a piece of work, measured by the allocator.

CUDA: `torch.cuda.max_memory_allocated` after a reset, minus what was
allocated before. CPU: the profiler's allocator events (`profile_memory=True`)
read from its raw event tree; their running `total_allocated` counts only what
profiling saw, continuing from the previous session (process RSS would include
the allocator's caches and the interpreter, and says nothing about one step).
Not inside a profiler session of the caller's: sessions do not nest, and opening
one ended the caller's, silently, and measured 0 bytes (found by a review).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from remat_ir.ir import RematIRError


class ProfilerActive(RematIRError):
    """CPU memory cannot be measured inside a profiler session of the caller's."""


@dataclass
class Measured:
    """What one call did: its result and the peak bytes allocated above the start."""
    result: object
    peak_bytes: int


def _cpu_allocations(prof) -> list[tuple[int, int, int]]:
    """(time, bytes allocated (negative: freed), running total) for every CPU allocator
    event, in time order."""
    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        kind, fields = event.typed
        if kind.name == "Allocation" and fields.device.type == "cpu":
            events.append((event.start_time_ns, fields.alloc_size, fields.total_allocated))
        stack.extend(event.children)
    events.sort()
    return events


def measure_peak(fn: Callable[[], object], device: torch.device | str) -> Measured:
    """Run `fn()` once and measure its peak allocation on `device` (CPU or CUDA), net of
    what it frees of older tensors. On the CPU such a free counts only where an earlier
    measurement saw the tensor made (the profiler knows no other's size): free the last
    step's gradients before `fn`, not in it, or two steps measured one after the other
    are measured differently (the README's example did: hunt86)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        torch.cuda.synchronize(device)
        return Measured(result, torch.cuda.max_memory_allocated(device) - start)
    from torch.profiler import ProfilerActivity, profile

    if torch.autograd._profiler_enabled():
        raise ProfilerActive(
            "a profiler session is active (torch.profiler.profile or another): remat-ir "
            "measures CPU memory with a profiler session of its own, and sessions do not nest: "
            "yours would come back without its events and this measurement would read 0 bytes "
            "(a plan made from it may exceed its budget). Measure outside the profiler; where "
            "a call inside it meets a new input signature (profiled costs are measured then), "
            "call the model on such a batch once before profiling")
    # Kineto prints two "USDT" lines on stderr per profiling session (profiled lowering
    # measures every distinct op: thousands of lines); level 6 silences them. Read when the
    # profiler first starts; a level the user set wins.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = _cpu_allocations(prof)
    if not events:
        return Measured(result, 0)
    # The running total carries over from earlier profiling sessions: measure from the
    # total just before this session's first event.
    _, first_size, first_total = events[0]
    start = first_total - first_size
    return Measured(result, max(0, max(total for *_, total in events) - start))
