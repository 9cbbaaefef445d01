"""Where a plan's recomputations run: just before the step that first reads them.

Why: solvers place a recomputation anywhere between what it reads and its first reader,
and where is free in their model (the same ops, the same time, a peak set elsewhere).
Hiremate's plan for the quick CNN at torch.compile 0.5's peak recomputed a BatchNorm +
ReLU 200 steps before the backward nodes that read it. Run compiled, that puts the
recomputation and its readers in different regions, so Inductor cannot fuse them (the
recomputed result is written to memory and read back; a region boundary costs a call),
and run op by op the result is out of cache when it is read. Next to its reader,
Inductor fuses a pointwise recomputation into the reading kernel, as torch.compile does
with its own.

`sink_recomputations` moves every backward recomputation, latest first (so that a chain
of recomputations follows its last member), to just before its first reader
(`sunk_order`). A moved step holds its inputs longer and its outputs less long, so the
plan's peak may change: the moves are kept all together when the simulated peak does
not rise (the usual case), else one by one, each kept only if the peak stays where it
was.
"""

from __future__ import annotations

from remat_ir.ir import InvalidSchedule, compute_sequence, forward_length, pb, simulate

from .base import Deadline
from .sequences import simulated_schedule
from .structure import TrainingGraph

#: Forward node -> the nodes that read its results.
Users = dict[int, frozenset[int]]


def sink_recomputations(tg: TrainingGraph, schedule: pb.Schedule,
                        deadline: Deadline | None = None) -> pb.Schedule:
    """`schedule` with its backward recomputations moved to their first readers, its peak
    no higher and its compute steps the same (so its predicted time is unchanged).
    Returned as it is when it has steps other than compute and free (offloads), when
    nothing moves, or when no move keeps the peak."""
    if {step.WhichOneof("action") for step in schedule.steps} - {"compute", "free"}:
        return schedule
    sequence = compute_sequence(schedule)
    forward = forward_length(schedule)
    users = _readers(tg)
    candidates = _candidates(users, sequence, forward)
    every = _moved(users, sequence, candidates)
    if every == sequence:
        return schedule
    peak = (schedule.predicted_peak_bytes if schedule.HasField("predicted_peak_bytes")
            else simulate(tg.graph, schedule).peak_bytes)

    def made(seq: list[int]) -> pb.Schedule | None:
        try:
            candidate, result = simulated_schedule(tg, seq, forward, name=schedule.name,
                                                   status=schedule.status)
        except InvalidSchedule:
            return None
        return candidate if result.peak_bytes <= peak else None

    if (moved := made(every)) is not None:
        return _as(schedule, moved)
    best, kept, current = None, [], sequence
    for i in candidates:
        if deadline is not None and deadline.expired():
            break
        trial = _moved(users, sequence, kept + [i])
        if trial != current and (candidate := made(trial)) is not None:
            best, kept, current = candidate, kept + [i], trial
    return schedule if best is None else _as(schedule, best)


def sunk_order(tg: TrainingGraph, sequence: list[int], forward_length: int) -> list[int]:
    """The compute sequence with every backward recomputation moved to its first reader
    (what `sink_recomputations` keeps when the peak allows it)."""
    users = _readers(tg)
    return _moved(users, sequence, _candidates(users, sequence, forward_length))


def _readers(tg: TrainingGraph) -> Users:
    return {n: frozenset(tg.node_users[n]) for n in tg.forward}


def _candidates(users: Users, sequence: list[int], forward_length: int) -> list[int]:
    """Positions of the backward recomputations, latest first: a move only changes
    positions after its own, so each earlier step is still where it was, and moves to
    its first reader as moved so far (a chain of recomputations follows its last)."""
    return [i for i in range(len(sequence) - 1, forward_length - 1, -1) if sequence[i] in users]


def _first_reader(users: Users, sequence: list[int], i: int) -> int | None:
    """Position of the first step after `i` that reads a result of step `i`'s node, or
    None (nothing reads it, or a later copy of the same node comes first)."""
    n, readers = sequence[i], users[sequence[i]]
    for j in range(i + 1, len(sequence)):
        if sequence[j] == n:
            return None
        if sequence[j] in readers:
            return j
    return None



def _moved(users: Users, sequence: list[int], positions: list[int]) -> list[int]:
    """`sequence` with the step at each of `positions` (latest first) moved to just before
    its first reader, where it has one further on."""
    moved = list(sequence)
    for i in positions:
        j = _first_reader(users, moved, i)
        if j is not None and j > i + 1:
            moved.insert(j - 1, moved.pop(i))
    return moved


def _as(original: pb.Schedule, made: pb.Schedule) -> pb.Schedule:
    """`made` with what `original` said of itself (solver, its parameters, budget)."""
    made.solver = original.solver
    made.solver_params.update(original.solver_params)
    if original.HasField("budget_bytes"):
        made.budget_bytes = original.budget_bytes
    made.solve_time_s = original.solve_time_s
    return made
