"""The memory-footprint term of the time model, calibrated on a second timed schedule.

Why: ops timed inside the store-everything step (`timing.py`) carry the cost of
that step's footprint. A schedule that holds less memory runs its *other* ops
faster too. Measured on CPU (GPT-2 4 layers, d=128, one process): at half of
store-everything's peak, forward first runs take 5-10% less time and backward
ops 10-15% less, because what they read was written more recently and what they
write reuses memory just freed instead of memory last touched a step ago (or
paged in anew). Priced on store-everything's op times alone, hiremate's 50% plan
was predicted at 1.12x store-everything's step and measured at 1.03x-1.06x.

The model: a schedule's step takes

    overhead + sum over compute steps of c(n) + peak_byte_s x peak

where c(n) = max(0, t(n) - peak_byte_s x g(n)), t(n) is node n's time inside the
store-everything step and g(n) the bytes by which it raises that step's
high-water mark (the g(n) sum to store-everything's peak), so that
store-everything is predicted as it was timed and a recomputation costs what the
op costs without store-everything's footprint. `peak_byte_s` is the least value
for which the model predicts a second, low-memory schedule's timed step (Chen's
sqrt checkpoints: cheap to build, its peak well below store-everything's) within
what was measured relative to store-everything's: a single-parameter fit on one
schedule, judged on the plans of other solvers (`benchmarks/training_step.py`).

"Within what was measured": the measured ratio is taken at the top of the interval
that resampling the timed rounds gives it (`timing.ratio_interval`), so the price is
only what the timings demand beyond their own spread, and 0 where the low-memory
step is no faster than its op times predict by more than that spread. Why: fitted
to the one measured ratio, the price is decided by a difference of a few percent
between two timed steps, which is what a shared CPU's noise moves them by; it
ranged 0-0.15 ms per MiB between lowerings of the same GPT-2, and so did the plans.
Measured with enough rounds to tell (`python benchmarks/time_model.py`, run
20261126-073151: 100 interleaved rounds), lowerings whose price came out 0 on both
quick models predicted every plan within 2.4% of its measured step (GPT-2: 9 plans
from 95% of store-everything's peak to 19%; the CNN: 5 plans, 95% to 57%).

On CPU the price depends on the allocator: with glibc's default dynamic mmap
threshold, large tensors are paged in afresh at every step or not depending on
the process's history, and the price calibrated on GPT-2 ranged 0.10-0.15 ms per
MiB of peak between lowerings; with fixed thresholds (as the benchmark sets
them) 0.04-0.06. On CUDA the caching allocator keeps memory, and the price is
what the cache makes of the footprint.
"""

from __future__ import annotations

import statistics

from remat_ir.ir import Graph, compute_sequence, pb, simulate
from remat_ir.ir.simulator import SimulationResult

from .timing import ScheduleTiming, ratio_interval

#: A low-memory schedule whose peak is above this share of store-everything's tells too
#: little about the footprint's cost: no calibration then.
MIN_PEAK_REDUCTION = 0.2


def high_water_increments(schedule: pb.Schedule, simulated: SimulationResult) -> list[int]:
    """Per compute step of `schedule` (simulated as `simulated`), the bytes by which it
    raises the step's memory above every earlier step's (their sum is the peak)."""
    out, high = [], 0
    for during, step in zip(simulated.memory_during, schedule.steps):
        if step.HasField("compute"):
            out.append(max(0, during - high))
        high = max(high, during)
    return out


class _Model:
    """The step-time model of the module docstring for one value of peak_byte_s."""

    def __init__(self, store: pb.Schedule, simulated: SimulationResult, timing: ScheduleTiming):
        self.seconds = timing.node_seconds()
        self.raised = {}
        for node, raised in zip(compute_sequence(store), high_water_increments(store, simulated)):
            self.raised[node] = self.raised.get(node, 0) + raised
        self.overhead = timing.overhead_s

    def node_costs(self, peak_byte_s: float) -> dict[int, float]:
        return {n: max(0.0, t - peak_byte_s * self.raised.get(n, 0)) for n, t in self.seconds.items()}

    def step(self, peak_byte_s: float, computed: list[int], peak: int) -> float:
        costs = self.node_costs(peak_byte_s)
        return self.overhead + sum(costs[n] for n in computed) + peak_byte_s * peak


def fit_peak_byte_cost(graph: Graph, store: pb.Schedule, store_timing: ScheduleTiming,
                       low: pb.Schedule, low_timing: ScheduleTiming) -> tuple[float, dict[int, float]] | None:
    """(peak_byte_s, node costs): the least price for which the model predicts `low`'s
    timed step relative to `store`'s within what was measured (the robust ratio of their
    steps, moved up to the top of the interval their rounds give it, where the timings
    hold rounds); None when `low` does not hold enough less memory to tell. A low-memory
    step measured no faster than the op times predict gives 0."""
    simulated = simulate(graph, store)
    store_peak, low_peak = simulated.peak_bytes, simulate(graph, low).peak_bytes
    if low_peak > (1 - MIN_PEAK_REDUCTION) * store_peak:
        return None
    model = _Model(store, simulated, store_timing)
    store_computed, low_computed = compute_sequence(store), compute_sequence(low)
    target = low_timing.robust_step_s / store_timing.robust_step_s
    rounds = min(len(low_timing.round_s), len(store_timing.round_s))
    if rounds >= 2:
        low_rounds, store_rounds = low_timing.round_s[:rounds], store_timing.round_s[:rounds]
        _, high = ratio_interval(low_rounds, store_rounds)
        middle = statistics.median(low_rounds) / statistics.median(store_rounds)
        target *= max(1.0, high / middle)

    def excess(peak_byte_s: float) -> float:
        """Predicted minus measured ratio of the low-memory step to store-everything's."""
        return (model.step(peak_byte_s, low_computed, low_peak)
                / model.step(peak_byte_s, store_computed, store_peak) - target)

    if excess(0.0) <= 0:
        return 0.0, model.node_costs(0.0)
    # The predicted ratio falls as peak_byte_s grows (the low schedule holds less): bracket
    # the root, then bisect. At one second per byte every op cost is clamped to 0.
    high = 1e-12
    while excess(high) > 0:
        high *= 2
        if high > 1.0:
            return None
    low_end = 0.0
    for _ in range(60):
        middle = (low_end + high) / 2
        if excess(middle) > 0:
            low_end = middle
        else:
            high = middle
    return low_end, model.node_costs(low_end)
