"""Schedules that need no optimisation: the references every solver is compared to.

- `autograd`: store every result backward reads (what PyTorch does).
- `recompute-all`: keep nothing but inputs; before each backward node,
  recompute the forward results it reads and drop them right after (the
  least memory without checkpoints, quadratic recomputation).
- `sqrt`: Chen et al. (2016): keep only the outputs of about sqrt(k) of the k
  forward segments (cut at articulation points); backward recomputes one
  segment at a time from its checkpoint (the lowest peak of a few spacings).
- `prefix_schedules` (no solver of its own; starts and candidates for small
  graphs in `hiremate`): keep what backward reads after a cut, recompute the
  rest before it on demand.
- `density_schedules` (candidates for `hiremate`): keep the results that take the
  most time per byte to recompute, recompute the rest on demand.
"""

from __future__ import annotations

import math

from remat_ir.ir import Graph, pb, store_all

from .base import Deadline, InfeasibleBudget, quiet
from .sequences import keep_set_schedule
from .structure import TrainingGraph


def within(schedule: pb.Schedule, budget: int | None, solver: str) -> pb.Schedule:
    """`schedule` if it fits `budget`, else InfeasibleBudget naming its peak."""
    if budget is not None and schedule.predicted_peak_bytes > budget:
        raise InfeasibleBudget(budget, schedule.predicted_peak_bytes,
                               f" ({solver} has a single schedule; try another solver)",
                               schedule=schedule)
    return schedule


def recompute_everything(tg: TrainingGraph) -> pb.Schedule:
    return keep_set_schedule(tg, (), name="recompute-all", forget_each_step=True)


#: How many thresholds `density_schedules` tries.
DENSITY_STEPS = 32


def density_schedules(tg: TrainingGraph, steps: int = DENSITY_STEPS,
                      deadline: Deadline | None = None) -> list[pb.Schedule]:
    """For thresholds over the forward results' recomputation time per byte: keep the
    results at or above it, recompute the rest on demand (a view goes with the result it
    views). Matmul outputs cost much per byte, pointwise results little, so these are the
    "save the matmuls" plans (torch's selective checkpointing policy) at every memory
    level. On the 32-layer Llama graph the one at 50% of the peak costs 5.0% against the
    H-ILP's 9.8%: the H-ILP's per-cluster grid of options misses the plan that keeps the
    same few results in every layer. Stops early at the deadline."""
    density = {n: tg.time[n] / tg.memory[n] if tg.memory[n] else math.inf for n in tg.forward}
    levels = sorted({density[tg.root(n)] for n in tg.forward} - {math.inf})
    if not levels:
        return []
    thresholds = sorted({levels[round(i * (len(levels) - 1) / max(1, steps - 1))] for i in range(steps)})
    found = []
    for threshold in thresholds:
        if deadline is not None and deadline.expired():
            break
        kept = [n for n in tg.forward if density[tg.root(n)] >= threshold]
        found.append(keep_set_schedule(tg, kept, name="density"))
    return found


def sqrt_checkpoints(tg: TrainingGraph, count: int, by_memory: bool = False) -> list[int]:
    """Last nodes of `count` runs of the forward segments, evenly spaced by segment count
    or (`by_memory`) by the bytes the segments' forward nodes allocate: the kept
    checkpoints."""
    segments = tg.segments
    weights = [sum(tg.memory[n] for n in s.forward) if by_memory else 1 for s in segments]
    if sum(weights) == 0:   # nothing allocates: space by count
        weights = [1] * len(segments)
    total, done, chosen = sum(weights), 0, []
    for k, weight in enumerate(weights):
        before, done = done, done + weight
        # the segment where the running total crosses the next of count even shares
        if done * count // total > before * count // total or k == len(segments) - 1:
            chosen.append(k)
    return [segments[k].forward[-1] for k in chosen]


def sqrt_schedule(tg: TrainingGraph) -> pb.Schedule:
    """Chen et al.'s checkpoints, the lowest-peak plan of six: about sqrt(k) runs of the k
    segments (one fewer, as many, one more), spaced by count or by memory. Why: where
    the checkpoints fall decides the peak, and one spacing alone is fragile. On the test
    GPT-2 (2 layers, d=32, seq 64), splitting each dropout into mask and product added
    five cuts, and the count-spaced plan at sqrt(45) runs rose from 52% to 96% of
    store-everything's peak (a checkpoint inside attention, the residual stream
    recomputed from the embeddings); the best of six is 57%."""
    segments = len(tg.segments)
    centre = max(1, round(math.sqrt(segments)))
    plans = []
    for count in sorted({max(1, centre - 1), centre, min(segments, centre + 1)}):
        for by_memory in (False, True):
            kept = set(sqrt_checkpoints(tg, count, by_memory))
            plans.append(keep_set_schedule(tg, tg.with_roots(kept), name="sqrt"))
    return min(plans, key=lambda s: (s.predicted_peak_bytes, s.predicted_time_s))


def prefix_schedules(tg: TrainingGraph) -> list[pb.Schedule]:
    """For each cut of the forward graph: keep what backward reads after the cut and
    recompute the part before it on demand, its results living until their last
    backward use or (the second schedule) only for the backward node needing them.
    Where early, full-resolution layers hold the peak (a CNN's first convolutions),
    these reach recompute-all's least memory for a fraction of its recomputation.
    Two schedules per cut, each a pass over the graph: meant for small graphs."""
    needed = tg.with_roots(tg.needed_by_backward)
    found = []
    for cut in tg.cuts[:-1]:
        kept = {n for n in needed if tg.position[n] > cut}
        for forget in (False, True):
            found.append(keep_set_schedule(tg, kept, name="prefix", forget_each_step=forget))
    return found


def autograd(graph: Graph, budget: int | None, *, time_limit_s=None, progress=quiet) -> pb.Schedule:
    """Store every result backward reads; no recomputation (PyTorch's default)."""
    schedule = store_all(graph)
    schedule.name = "autograd"
    return within(schedule, budget, "autograd")


def recompute_all(graph: Graph, budget: int | None, *, time_limit_s=None, progress=quiet) -> pb.Schedule:
    """Keep only inputs; each backward node recomputes what it reads, dropped right after."""
    return within(recompute_everything(TrainingGraph(graph)), budget, "recompute-all")


def sqrt(graph: Graph, budget: int | None, *, time_limit_s=None, progress=quiet) -> pb.Schedule:
    """Chen et al.'s sqrt(n) checkpointing over the forward graph's articulation points."""
    return within(sqrt_schedule(TrainingGraph(graph)), budget, "sqrt")
