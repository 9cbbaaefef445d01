"""Trimming a schedule's recomputations within its budget, on the simulator's curve.

A plan from an approximate memory model leaves room under the simulator's
memory curve, and spends recomputation where a cheaper one would free the
same bytes: hiremate's H-ILP counts a stage's recomputations together and
offers each cluster a few options from a coarse grid. `trim_recomputations`
improves such a plan by two local moves, each checked by the simulator:

- **drop** a backward recomputation of `n`: `n`'s previous copy is kept
  from its last read before the recomputation on, so `n`'s bytes are added
  over that interval and nowhere else. The recomputations that only fed it
  go too.
- **swap**: where a drop is blocked by the budget at some steps, first
  recompute cheap results that lie idle over those steps (a copy not read
  between two reads, whose inputs are there at the second read: recomputing
  it just before frees its bytes in between), as long as they cost less
  than the recomputation dropped.

Candidates are screened on the memory curve before they are simulated, and
moves whose intervals do not overlap are tried together first, so that a
pass over a thousand-node plan takes seconds (on the U-Net of
`benchmarks/hiremate.py` at 30% of its peak: predicted overhead 24% down
to 14%). Every accepted move is checked by the simulator: the result is a
valid schedule within the budget, never slower than the one given, and the
deadline only stops the search early.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

from remat_ir.ir import InvalidSchedule, SimulationResult, compute_sequence, forward_length, pb

from .base import Deadline, quiet
from .sequences import simulated_schedule
from .structure import TrainingGraph

#: Seconds between progress lines on a long search.
PROGRESS_SECONDS = 5.0


def trim_recomputations(tg: TrainingGraph, schedule: pb.Schedule, budget: int,
                        deadline: Deadline, progress=quiet, label: str = "trim") -> pb.Schedule:
    """`schedule` with the backward recomputations the budget lets it drop or trade for
    cheaper ones, as a compute sequence (frees after last uses; a schedule with
    offloads, or over the budget, is returned as it is)."""
    actions = {step.WhichOneof("action") for step in schedule.steps}
    if actions - {"compute", "free"} or schedule.predicted_peak_bytes > budget:
        return schedule
    sequence = compute_sequence(schedule)
    forward = forward_length(schedule)
    try:
        made = simulated_schedule(tg, sequence, forward, name=schedule.name,
                                  status=schedule.status)
    except InvalidSchedule:
        return schedule
    if made[0].predicted_time_s > schedule.predicted_time_s or made[0].predicted_peak_bytes > budget:
        return schedule
    plan = _Curve(tg, sequence, forward, *made)
    start_time, moves, rejected, said = plan.schedule.predicted_time_s, 0, 0, time.monotonic()
    while not deadline.expired():
        for trial in plan.moves(budget, deadline):
            if deadline.expired():
                break
            try:
                made = simulated_schedule(tg, trial, forward, name=schedule.name,
                                          status=schedule.status)
            except InvalidSchedule:
                rejected += 1
                continue
            if (made[0].predicted_peak_bytes <= budget
                    and made[0].predicted_time_s < plan.schedule.predicted_time_s):
                plan = _Curve(tg, trial, forward, *made)
                moves += 1
                break
            rejected += 1
        else:
            break  # no move left
        if time.monotonic() - said >= PROGRESS_SECONDS:
            said = time.monotonic()
            progress(f"{label}: {moves} recomputation changes so far, time "
                     f"{plan.schedule.predicted_time_s / start_time:.3f}x the plan's")
    if not moves:
        return schedule
    progress(f"{label}: {moves} recomputation changes ({rejected} tries in vain); time "
             f"{plan.schedule.predicted_time_s / start_time:.3f}x the plan's, peak "
             f"{plan.schedule.predicted_peak_bytes} bytes")
    plan.schedule.solver = schedule.solver
    return plan.schedule


@dataclass(frozen=True)
class _Drop:
    position: int   # of the recomputation
    start: int      # the previous copy would live from here to `position`
    time: float     # the recomputation's time


@dataclass(frozen=True)
class _Idle:
    """A copy of `node` not read after `after` until `before`, where its inputs are there:
    recomputed just before `before`, it frees its bytes in between."""
    node: int
    after: int
    before: int


class _Curve:
    """A compute sequence with the simulator's memory curve, and the moves it allows."""

    def __init__(self, tg: TrainingGraph, sequence: list[int], forward_length: int,
                 schedule: pb.Schedule, simulation: SimulationResult):
        self.tg, self.sequence, self.forward_length = tg, sequence, forward_length
        self.schedule = schedule
        self.forward = set(tg.forward)
        #: Memory while each computation runs (or the frees after it, if higher).
        self.during: list[int] = []
        for step, memory in zip(schedule.steps, simulation.memory_during):
            if step.WhichOneof("action") == "compute":
                self.during.append(memory)
            elif self.during:
                self.during[-1] = max(self.during[-1], memory)
        #: Positions reading the copy made at each position, in order.
        self.reads: dict[int, list[int]] = {}
        self.drops: list[_Drop] = []
        made: dict[int, int] = {}
        for i, n in enumerate(sequence):
            for p in tg.node_inputs(n):
                if p in made:
                    self.reads.setdefault(made[p], []).append(i)
            if i >= forward_length and n in self.forward and n in made:
                before = made[n]
                start = self.reads[before][-1] + 1 if before in self.reads else before + 1
                self.drops.append(_Drop(i, start, tg.time[n]))
            made[n] = i
        self.drops.sort(key=lambda d: (-d.time, d.position))

    def bytes_of(self, n: int) -> int:
        return self.tg.memory[self.tg.root(n)]

    def excess(self, drop: _Drop, budget: int) -> int:
        """Bytes over the budget the drop makes at its worst step (<= 0: it fits)."""
        if drop.start >= drop.position:
            return 0
        added = self.bytes_of(self.sequence[drop.position])
        return max(self.during[drop.start:drop.position]) + added - budget

    def moves(self, budget: int, deadline: Deadline) -> Iterator[list[int]]:
        """Trial sequences, the likeliest gains first: the drops that fit together, each
        drop that fits, then the swaps. Searching for a swap can take seconds on a plan
        of thousands of recomputations without yielding one: it stops at the deadline."""
        fitting = [d for d in self.drops if self.excess(d, budget) <= 0]
        together = _disjoint(fitting)
        if len(together) > 1:
            yield self.changed(removed=together)
        for drop in fitting:
            yield self.changed(removed=[drop])
        idle = None
        for drop in self.drops:
            if deadline.expired():
                return
            if self.excess(drop, budget) > 0:
                idle = self.idle_copies() if idle is None else idle
                inserted = self.swap_for(drop, budget, idle)
                if inserted:
                    yield self.changed(removed=[drop], inserted=inserted)

    def swap_for(self, drop: _Drop, budget: int, idle: list[_Idle]) -> list[_Idle]:
        """Idle copies to recompute so that `drop` fits, cheapest per byte first, if they
        cost less than the recomputation dropped (else none)."""
        added = self.bytes_of(self.sequence[drop.position])
        over = [k for k in range(drop.start, drop.position) if self.during[k] + added > budget]
        first, last = over[0], over[-1]
        need = max(self.during[k] for k in over) + added - budget
        covering = sorted((c for c in idle if c.after < first and c.before > last),
                          key=lambda c: self.tg.time[c.node] / self.bytes_of(c.node))
        chosen, freed, cost = [], 0, 0.0
        for c in covering:
            if freed >= need:
                break
            # A chosen copy read by another's recomputation would no longer lie idle.
            if any(c.node in self.inputs[o.node] or o.node in self.inputs[c.node] for o in chosen):
                continue
            chosen.append(c)
            freed += self.bytes_of(c.node)
            cost += self.tg.time[c.node]
        return chosen if freed >= need and cost < drop.time else []

    @cached_property
    def inputs(self) -> dict[int, frozenset[int]]:
        """Per node of the sequence, the nodes whose results it reads."""
        return {n: frozenset(self.tg.node_inputs(n)) for n in set(self.sequence)}

    def idle_copies(self) -> list[_Idle]:
        """Copies of forward results lying unread between their making or a read and a
        later read in the backward, where their inputs' copies are there."""
        tg, seq = self.tg, self.sequence
        copies: dict[int, list[int]] = {}   # node -> positions of its copies
        for i, n in enumerate(seq):
            copies.setdefault(n, []).append(i)
        found = []
        for made_at, readers in self.reads.items():
            n = seq[made_at]
            if (n not in self.forward or n not in tg.recomputable or n in tg.view_root
                    or not self.bytes_of(n)):
                continue
            previous = made_at
            for reader in readers:
                if reader >= self.forward_length and reader - previous > 1 and all(
                        self._there(copies.get(p, []), reader) for p in tg.node_inputs(n)
                        if p in self.forward):
                    found.append(_Idle(n, previous, reader))
                previous = reader
        return found

    def _there(self, copies: list[int], position: int) -> bool:
        """Whether the copy (of those at `copies`) current at `position` is live there."""
        k = bisect.bisect_left(copies, position)
        if k == 0:
            return False
        made_at = copies[k - 1]
        return self.reads.get(made_at, [made_at])[-1] >= position

    def changed(self, removed: list[_Drop], inserted: list[_Idle] = ()) -> list[int]:
        """The sequence without the `removed` recomputations (nor those only feeding
        them), with the `inserted` ones before their readers."""
        before: dict[int, list[int]] = {}
        for c in inserted:
            before.setdefault(c.before, []).append(c.node)
        gone = {d.position for d in removed}
        trial = []
        for i, n in enumerate(self.sequence):
            trial += before.get(i, [])
            if i not in gone:
                trial.append(n)
        return _without_dead(self.tg, trial, self.forward_length, self.forward)


def _disjoint(drops: list[_Drop]) -> list[_Drop]:
    """The drops (in their order) whose intervals of added bytes do not overlap: each
    fits alone, so all of them fit together."""
    chosen: list[_Drop] = []
    for d in drops:
        if all(d.position <= c.start or c.position <= d.start for c in chosen):
            chosen.append(d)
    return chosen


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
                if i < forward_length or read[i] or n not in forward or n in tg.held_outputs]
        if len(kept) == len(sequence):
            return sequence
        sequence = kept
