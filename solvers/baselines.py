"""Schedules that need no optimisation: the references every solver is compared to.

- `autograd`: store every result backward reads (what PyTorch does).
- `recompute-all`: keep nothing but inputs; before each backward node,
  recompute the forward results it reads and drop them right after (the
  least memory without checkpoints, quadratic recomputation).
- `sqrt`: Chen et al. (2016): keep only the outputs of about sqrt(k) of the k
  forward segments (cut at articulation points); backward recomputes one
  segment at a time from its checkpoint.
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


def sqrt_checkpoints(tg: TrainingGraph) -> list[int]:
    """Last nodes of about sqrt(k) evenly spaced segments out of k: the kept checkpoints."""
    segments = tg.segments
    count = max(1, round(math.sqrt(len(segments))))
    stride = len(segments) / count
    chosen = {min(len(segments) - 1, round((j + 1) * stride) - 1) for j in range(count)}
    return [segments[k].forward[-1] for k in sorted(chosen)]


def sqrt_schedule(tg: TrainingGraph) -> pb.Schedule:
    kept = set(sqrt_checkpoints(tg))
    kept.update(tg.view_root[n] for n in list(kept) if n in tg.view_root)
    return keep_set_schedule(tg, kept, name="sqrt")


def prefix_schedules(tg: TrainingGraph) -> list[pb.Schedule]:
    """For each cut of the forward graph: keep what backward reads after the cut and
    recompute the part before it on demand, its results living until their last
    backward use or (the second schedule) only for the backward node needing them.
    Where early, full-resolution layers hold the peak (a CNN's first convolutions),
    these reach recompute-all's least memory for a fraction of its recomputation.
    Two schedules per cut, each a pass over the graph: meant for small graphs."""
    needed = set(tg.needed_by_backward)
    needed |= {tg.view_root[n] for n in needed if n in tg.view_root}
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
