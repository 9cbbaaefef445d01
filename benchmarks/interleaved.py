"""Interleaved timing of variants that a benchmark compares.

The machine these benchmarks run on is shared and noisy, so a ratio is only worth quoting
when its terms were measured under the same load. Each round runs every variant in turn:
an untimed call first (the allocator and caches settle into that variant's state), then
`calls` timed calls whose mean is the round's figure. Quote the ratio of the medians over
rounds.
"""

from __future__ import annotations

import time
from typing import Callable


def interleaved_seconds(variants: dict[str, Callable[[], object]], rounds: int, calls: int,
                        before: Callable[[str], None] | None = None) -> dict[str, list[float]]:
    """Seconds per call of each variant, one figure per round, the variants taking turns.

    `before(name)` runs ahead of each variant's turn, untimed: switching the state the
    variant needs (a runner's routes) or clearing what the last one left (gradients)."""
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, call in variants.items():
            if before is not None:
                before(name)
            call()
            start = time.perf_counter()
            for _ in range(calls):
                call()
            seconds[name].append((time.perf_counter() - start) / calls)
    return seconds
