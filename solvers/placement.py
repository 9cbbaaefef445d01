"""Where a plan's steps run: recomputations just before their first readers, the forward
in eager's order.

Why: solvers place a recomputation anywhere between what it reads and its first reader,
and where is free in their model (the same ops, the same time, a peak set elsewhere).
Hiremate's plan for the quick CNN at torch.compile 0.5's peak recomputed a BatchNorm +
ReLU 200 steps before the backward nodes that read it. Run compiled, that puts the
recomputation and its readers in different regions, so Inductor cannot fuse them (the
recomputed result is written to memory and read back; a region boundary costs a call),
and run op by op the result is out of cache when it is read. Next to its reader,
Inductor fuses a pointwise recomputation into the reading kernel, as torch.compile does
with its own.

The forward's own order is just as free in the model, and just as real outside it. With
its MILP stopped early, hiremate's plan for six FSDP units at 50% computed the
transposes of units 1, 3 and 5's weights and the head's (they read parameters alone)
among unit 0's ops: the same predicted time and peak, but FSDP gathers a unit's
parameters when its ops run, so that forward held three units at once where eager
holds one.

`sink_to_readers` moves every backward recomputation, latest first (so that a chain of
recomputations follows its last member), to just before its first reader. Then it puts
the forward in eager's order: every forward step, latest first, moves later past the
steps eager runs before it (nodes earlier in the graph, whose order is eager's), up to
a reader or a step the forward runs more than once (a recomputation within the forward
and what lies around it stay as the plan placed them): an insertion sort, so that
between such steps the forward follows the graph (`sunk_order`). A moved step holds
its inputs longer and its outputs less long, so the plan's peak may change: each of
the two sets of moves is kept whole when the simulated peak does not rise (the usual
case), else in halves, each half kept whole where the peak stays where it was and else
split again, down to single moves. Why halves: tried one by one, the moves of the floor plan
hiremate names with a refusal (a wav2vec2 recognizer at 60%: 5,972 steps) took 2,225
simulations, 70 s, and cut into the time limit (the refusal came after the whole 30 s);
a move that raises the peak is rare, and bisecting finds the few with far fewer runs.
"""

from __future__ import annotations

from collections import Counter

from remat_ir.ir import InvalidSchedule, compute_sequence, forward_length, pb, simulate

from .base import Deadline
from .sequences import simulated_schedule
from .structure import TrainingGraph

#: Forward node -> the nodes that read its results.
Users = dict[int, frozenset[int]]


def sink_to_readers(tg: TrainingGraph, schedule: pb.Schedule,
                    deadline: Deadline | None = None) -> pb.Schedule:
    """`schedule` with its backward recomputations moved to their first readers, then its
    forward in eager's order where the plan allows (see the module's docstring): its
    peak no higher, its compute steps the same (so its predicted time is unchanged but
    for the order its costs are added in). Returned as it is when it has steps other
    than compute and free (offloads), when nothing moves, or when no move keeps the
    peak."""
    if {step.WhichOneof("action") for step in schedule.steps} - {"compute", "free"}:
        return schedule
    sequence = compute_sequence(schedule)
    forward = forward_length(schedule)
    users = _readers(tg)
    peak = (schedule.predicted_peak_bytes if schedule.HasField("predicted_peak_bytes")
            else simulate(tg.graph, schedule).peak_bytes)

    def made(seq: list[int]) -> pb.Schedule | None:
        try:
            candidate, result = simulated_schedule(tg, seq, forward, name=schedule.name,
                                                   status=schedule.status)
        except InvalidSchedule:
            return None
        return candidate if result.peak_bytes <= peak else None

    best = None
    for positions in (_backward_candidates(users, sequence, forward),
                      _forward_candidates(users, sequence, forward)):
        every = _moved(users, sequence, positions, forward)
        if every == sequence:
            continue
        if (moved := made(every)) is not None:
            best, sequence = moved, every
            continue
        kept, current = [], sequence

        def keep(batch: list[int]) -> None:
            """Keep `batch`'s moves together where the peak allows, else each half's."""
            nonlocal best, kept, current
            if deadline is not None and deadline.expired():
                return
            trial = _moved(users, sequence, kept + batch, forward)
            if trial == current:
                return
            if (candidate := made(trial)) is not None:
                best, kept, current = candidate, kept + batch, trial
            elif len(batch) > 1:
                keep(batch[:len(batch) // 2])
                keep(batch[len(batch) // 2:])

        keep(positions[:len(positions) // 2])   # all of them together raised the peak
        keep(positions[len(positions) // 2:])
        sequence = current
    return schedule if best is None else _as(schedule, best)


def sunk_order(tg: TrainingGraph, sequence: list[int], forward_length: int) -> list[int]:
    """The compute sequence with every backward recomputation moved to its first reader,
    then the forward in eager's order (what `sink_to_readers` keeps when the peak allows)."""
    users = _readers(tg)
    for positions in (_backward_candidates(users, sequence, forward_length),
                      _forward_candidates(users, sequence, forward_length)):
        sequence = _moved(users, sequence, positions, forward_length)
    return sequence


def _readers(tg: TrainingGraph) -> Users:
    return {n: frozenset(tg.node_users[n]) for n in tg.forward}


def _backward_candidates(users: Users, sequence: list[int], forward_length: int) -> list[int]:
    """Positions of the backward recomputations, latest first: a move only changes
    positions after its own, so each earlier step is still where it was, and moves to
    its first reader as moved so far (a chain of recomputations follows its last)."""
    return [i for i in range(len(sequence) - 1, forward_length - 1, -1) if sequence[i] in users]


def _forward_candidates(users: Users, sequence: list[int], forward_length: int) -> list[int]:
    """Positions of the forward's steps, latest first (for the same reason). The backward's
    moves, made first, leave them where they were."""
    return [i for i in range(forward_length - 1, -1, -1) if sequence[i] in users]


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


def _eager_place(users: Users, sequence: list[int], i: int, forward_length: int,
                 repeated: set[int]) -> int | None:
    """Position of the first step after forward step `i` that eager runs after it (a node
    of the graph's order past its own, a reader among them) or that the forward runs more
    than once (its recomputations stay as the plan placed them), else the forward's end;
    None for a step the forward runs more than once."""
    n, readers = sequence[i], users[sequence[i]]
    if n in repeated:
        return None
    for j in range(i + 1, forward_length):
        if sequence[j] > n or sequence[j] in readers or sequence[j] in repeated:
            return j
    return forward_length


def _moved(users: Users, sequence: list[int], positions: list[int],
           forward_length: int) -> list[int]:
    """`sequence` with the step at each of `positions` (latest first) moved to just before
    the step found for it, where that is further on: its first reader for a backward
    recomputation, its place in eager's order within the forward for a forward step."""
    moved = list(sequence)
    counts = Counter(sequence[:forward_length])
    repeated = {n for n, count in counts.items() if count > 1}
    for i in positions:
        j = (_first_reader(users, moved, i) if i >= forward_length
             else _eager_place(users, moved, i, forward_length, repeated))
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
