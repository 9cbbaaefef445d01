"""Dropping the recomputations a schedule can do without, within its budget.

A plan from an approximate memory model leaves slack under the simulator's
memory curve: hiremate's H-ILP counts a stage's recomputations together and
offers each cluster a few options from a coarse grid, so some of the
recomputations it plans could be replaced by keeping the earlier copy of the
result a little longer. `drop_recomputations` removes, most expensive first,
every backward recomputation whose removal keeps the peak within the budget,
together with the recomputations that only fed it (on the U-Net of
`benchmarks/hiremate.py` at 30% of its peak: 24% overhead down to 19%).

A candidate is screened on the memory curve before it is simulated: removing
the recomputation of `n` at position i keeps `n`'s previous copy from its
last read before i on, so `n`'s bytes are added over that interval and
nowhere else (its life from i on was counted already). Every accepted change
is checked by the simulator, so the result is a valid schedule within the
budget, never slower than the one given, and the deadline only stops the
search early.
"""

from __future__ import annotations

from remat_ir.ir import InvalidSchedule, SimulationResult, pb

from .base import Deadline, quiet
from .sequences import simulated_schedule
from .structure import TrainingGraph


def drop_recomputations(tg: TrainingGraph, schedule: pb.Schedule, budget: int,
                        deadline: Deadline, progress=quiet, label: str = "refine") -> pb.Schedule:
    """`schedule` without the backward recomputations the budget allows it to drop,
    as a compute sequence (frees after last uses; a schedule with offloads is
    returned as it is)."""
    actions = {step.WhichOneof("action") for step in schedule.steps}
    if actions - {"compute", "free"}:
        return schedule
    sequence = [step.compute for step in schedule.steps if step.WhichOneof("action") == "compute"]
    forward_length = sum(1 for step in schedule.steps[:schedule.backward_start]
                         if step.WhichOneof("action") == "compute")
    try:
        best, simulation = simulated_schedule(tg, sequence, forward_length, name=schedule.name,
                                              status=schedule.status)
    except InvalidSchedule:
        return schedule
    if best.predicted_time_s > schedule.predicted_time_s or best.predicted_peak_bytes > budget:
        return schedule
    forward = set(tg.forward)
    dropped = rejected = 0
    while not deadline.expired():
        during = _memory_per_computation(best, simulation)
        for position in _candidates(tg, sequence, forward_length, during, forward, budget):
            if deadline.expired():
                break
            trial = _without_dead(tg, sequence[:position] + sequence[position + 1:],
                                  forward_length, forward)
            try:
                made, made_simulation = simulated_schedule(tg, trial, forward_length,
                                                           name=schedule.name,
                                                           status=schedule.status)
            except InvalidSchedule:
                made = None
            if (made is not None and made.predicted_peak_bytes <= budget
                    and made.predicted_time_s < best.predicted_time_s):
                sequence, best, simulation = trial, made, made_simulation
                dropped += 1
                break
            rejected += 1
        else:
            break  # no candidate left
    if not dropped:
        return schedule
    progress(f"{label}: dropped {dropped} recomputations ({rejected} tried in vain); "
             f"time {best.predicted_time_s / schedule.predicted_time_s:.3f}x the plan's, "
             f"peak {best.predicted_peak_bytes} bytes")
    best.solver = schedule.solver
    return best


def _candidates(tg: TrainingGraph, sequence: list[int], forward_length: int,
                during: list[int], forward: set[int], budget: int) -> list[int]:
    """Positions of the backward recomputations whose removal the memory curve
    (`during`: memory while each computation runs) allows, the most expensive first."""
    last_read: dict[int, int] = {}   # position of a copy -> position of its last reader
    made: dict[int, int] = {}        # node -> position of its latest copy
    found = []
    for i, n in enumerate(sequence):
        for p in tg.node_inputs(n):
            if p in made:
                last_read[made[p]] = i
        if i >= forward_length and n in forward and n in made:
            before = made[n]
            start = last_read.get(before, before) + 1
            added = tg.memory[tg.view_root.get(n, n)]
            if start >= i or max(during[start:i]) + added <= budget:
                found.append((-tg.time[n], i))
        made[n] = i
    return [i for _, i in sorted(found)]


def _memory_per_computation(schedule: pb.Schedule, simulation: SimulationResult) -> list[int]:
    """The simulator's memory while each computation of `schedule` runs (or while the
    frees after it run, if higher)."""
    during: list[int] = []
    for step, memory in zip(schedule.steps, simulation.memory_during):
        if step.WhichOneof("action") == "compute":
            during.append(memory)
        elif during:
            during[-1] = max(during[-1], memory)
    return during


def _without_dead(tg: TrainingGraph, sequence: list[int], forward_length: int,
                  forward: set[int]) -> list[int]:
    """`sequence` without the backward recomputations nothing reads before the
    result is made again (or the end)."""
    while True:
        made: dict[int, int] = {}
        read = [False] * len(sequence)
        for i, n in enumerate(sequence):
            for p in tg.node_inputs(n):
                if p in made:
                    read[made[p]] = True
            made[n] = i
        kept = [n for i, n in enumerate(sequence)
                if i < forward_length or read[i] or n not in forward or n in tg.output_nodes]
        if len(kept) == len(sequence):
            return sequence
        sequence = kept
