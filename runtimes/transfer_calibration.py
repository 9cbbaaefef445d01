"""The host's time per transfer, calibrated inside a whole step.

Why: `transfers.issue_seconds` times the runtime's own offload, prefetch and wait calls
on a small value, alone. Inside a step a transfer costs the host more. Measured on an
H100 (torch 2.11, the quick GPT-2, whose step the host bounds: 12.6 ms, the GPU busy
about 3 ms of it): hiremate with offloading at 30% made 22 transfers, was predicted
x1.249 of store-everything's step and measured x1.499, while hiremate alone there
measured x1.226: the transfers cost the step 3.4 ms that the model did not see (about
155 us each), and the planner offloaded where recomputing was faster
(`benchmarks/results/time_model/20261128-012815-cuda.md`).

So the store-everything step is timed beside the same step with its `ROUND_TRIPS`
largest saved values sent to host memory and back: each offloaded once computed, freed
at the end of the forward and prefetched at the start of the backward (as much slack
as the step has, so that no copy is late on a fast link; a late one is a stall the
simulator counts). Rounds interleave the two (`timing.time_schedules`). The host time
per transfer is what makes the simulator's difference between the two steps match the
measured one (the median of the rounds' differences): with one timeline, (measured
difference - simulated difference without host time) / transfers; with two (a GPU's
host and device, `timing.split_timelines`), found by bisection, since host time costs
the step only where the host bounds it.
`remat_ir.lowering.add_costs` keeps the larger of it and the isolated measure, on
devices whose transfers overlap compute (CUDA; a CPU's copies are the compute
timeline's own, and the step measures them as such).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

import torch

from remat_ir.ir import Graph, pb, simulate
from remat_ir.ir.memory import counted
from remat_ir.ir.schedules import store_all

from .profiling import OP_ERRORS
from .timing import time_schedules

#: Saved values the calibration step sends to host memory and back.
ROUND_TRIPS = 8


def round_trip_schedule(graph: Graph, store: pb.Schedule | None = None,
                        count: int = ROUND_TRIPS) -> pb.Schedule | None:
    """`store` (store-everything's schedule of `graph`, made if not given) with its
    `count` largest saved values (each the only saved value in its storage) offloaded
    after their compute, freed at the end of the forward and prefetched at the start of
    the backward; None if it saves none or the simulator refuses the result."""
    store = store or store_all(graph)
    if store.backward_start == len(store.steps):
        return None  # no backward to prefetch for
    saved = simulate(graph, store).saved_value_ids
    holders: dict[int, list[int]] = {}
    for v in saved:
        if counted(graph, v):
            holders.setdefault(graph.value(v).storage_id, []).append(v)
    alone = [vs[0] for vs in holders.values() if len(vs) == 1]
    chosen = sorted(alone, key=lambda v: (-graph.storage_bytes(graph.value(v).storage_id), v))[:count]
    if not chosen:
        return None
    producer = {v: graph.producer(v) for v in chosen}
    steps, start = list(store.steps), store.backward_start
    schedule = pb.Schedule(name="store_all_round_trips", solver="calibration")
    for k, step in enumerate(steps):
        if k == start:
            schedule.steps.extend(pb.Step(free=v) for v in chosen)
            schedule.backward_start = len(schedule.steps)
            schedule.steps.extend(pb.Step(prefetch=v) for v in chosen)
        schedule.steps.append(step)
        if step.HasField("compute"):
            schedule.steps.extend(pb.Step(offload=v) for v in chosen
                                  if producer[v] == step.compute)
    return schedule if simulate(graph, schedule).valid else None


def fit_issue_seconds(graph: Graph, store: pb.Schedule, store_rounds: list[float],
                      trips: pb.Schedule, trips_rounds: list[float]) -> float | None:
    """Host seconds per transfer that make the simulator's time of `trips` minus that of
    `store` match the measured difference (median over paired rounds); None without
    two rounds of each. Never negative. With one timeline every second of host time per
    transfer adds one to the step per transfer; with two (`CostModel.two_timelines`) only
    where the host bounds the step, so the value is found by bisection on the simulator."""
    rounds = min(len(store_rounds), len(trips_rounds))
    if rounds < 2:
        return None
    measured = statistics.median(t - s for t, s in zip(trips_rounds[:rounds], store_rounds[:rounds]))
    link = graph.proto.provenance.host_link
    issue, base = link.issue_s, simulate(graph, store).total_time_s

    def added(issue_s: float) -> float:
        """The simulated difference between the two steps at `issue_s` per transfer."""
        link.issue_s = issue_s
        return simulate(graph, trips).total_time_s - base

    try:
        if added(0.0) >= measured:
            return 0.0
        high = 1e-6
        while added(high) < measured:
            high *= 2
            if high > 1.0:  # a second per transfer does not account for it: not a host cost
                return None
        low = 0.0
        for _ in range(40):  # to a millionth of a microsecond, from under a second
            middle = (low + high) / 2
            low, high = (middle, high) if added(middle) < measured else (low, middle)
        return high
    finally:
        link.issue_s = issue


def calibrate_issue_seconds(graph: Graph, values: Mapping[int, torch.Tensor], device: torch.device | str,
                            progress=None) -> float | None:
    """Time store-everything beside `round_trip_schedule` on the model's tensors
    (`values`, as `timing.time_schedules` takes them) and fit the host seconds per
    transfer (`fit_issue_seconds`); None where no round trip can be made or the steps
    cannot run (out of memory among others: the isolated measure then stands)."""
    store = store_all(graph)
    trips = round_trip_schedule(graph, store)
    if trips is None:
        return None
    try:
        store_timing, trips_timing = time_schedules(graph, [store, trips], values, device, progress=progress)
    except (*OP_ERRORS, KeyError):
        return None
    return fit_issue_seconds(graph, store, store_timing.round_s, trips, trips_timing.round_s)
