"""`fastsa`: simulated annealing over compute sequences (Imanishi et al., NeurIPS 2023).

A schedule is a sequence in which a recomputation is one more occurrence of a
node (`anneal.py` holds the compiled kernel: moves, exact peak by segment
tree). The objective is time x (max(budget, peak) / budget)^weight: the search
first pushes the peak under the budget, then cuts time (weight 1 is the paper's
max(budget, peak) x time; the default 8 prices an excess higher, and once a
plan fits no move past the budget is accepted). Two stages, as in the paper:

1. *Groups*: a forward node whose only reader is one node, and whose inputs
   take no more bytes than its outputs, is merged with that reader (keeping
   its inputs never costs more than keeping it, so it is recomputed with its
   reader). Annealing moves whole groups, which makes the large moves that
   matter early cheap; it stops once the peak fits.
2. *Nodes*: the groups' sequence, expanded, is annealed node by node.

What may move: forward nodes that may be recomputed (`TrainingGraph.recomputable`).
Backward nodes, in-place and non-recomputable nodes keep their one occurrence
where the start sequence has it; a random node's first run stays first (its RNG
state is replayed only for later runs), and so does that of a node producing a
graph output (a buffer update: the forward must hand it over).

`start="hiremate"` (or any solver name) starts stage 2 from that solver's plan
instead (stage 1 is skipped); `polish` does the same from given plans, and is
how hiremate anneals its own. Temperatures fall geometrically from 0.1% of the
start objective to 0.00001% of it (`T_FIRST`, `T_LAST`); the same seed and iteration counts give the
same schedule (unless a time limit cuts the moves). With a time limit the
moves run in chunks and stop when it is reached; the best schedule within the
budget seen at a chunk's end is returned, or InfeasibleBudget with the lowest
peak seen.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from remat_ir.ir import Graph, compute_sequence, pb, store_all
from remat_ir.ir.memory import new_storages

from . import anneal
from .base import BadRequest, Deadline, InfeasibleBudget, quiet
from .sequences import simulated_schedule
from .structure import TrainingGraph

#: Slots per occurrence of the start sequence: room for recomputations between nodes.
SPREAD = 8
#: Moves per compiled call between two looks at the clock.
CHUNK = 100_000
#: Moves when none are asked for: per node of the graph, and (polishing a start plan
#: that recomputes much) per occurrence of the start; at most MAX_ITERATIONS ...
MOVES_PER_NODE, MOVES_PER_OCCURRENCE, MAX_ITERATIONS = 300, 40, 6_000_000
#: ... and at least this many (half a second): 300 per node leaves a 30-node chain
#: above 60% of its peak, where 200,000 moves reach Checkmate's optimum at 50% ...
MIN_ITERATIONS = 200_000
#: ... or this many per node on a graph of fewer than 40 nodes, whose few orders it
#: searches in far fewer moves: of 270 cases (chains of 3-30 layers at 30-90% of their
#: peak, the tests' random graphs at 20-100%), 267 got the plan or named floor that
#: 200,000 moves gave, 2 a better one and 1 a higher floor, in a third of the time
#: (`benchmarks/fastsa_small_graphs.py`; 10,000 per node: 269 equal, 1 worse).
#: Checkmate and hiremate start from Fast SA on every call, and the tests call them on
#: such graphs thousands of times.
SMALL_GRAPH_MOVES_PER_NODE = 5_000
#: Plans running more nodes than this (recompute-everything on a 7,000-node graph:
#: 800,000) are not annealed: placing them takes longer than a time limit allows.
MAX_START_OCCURRENCES = 200_000
#: Start and end temperatures, as shares of the start objective (the paper's).
T_FIRST, T_LAST = 1e-3, 1e-7
#: The price of an excess over the budget (`anneal.objective`); the paper's objective,
#: max(budget, peak) x time, is weight 1, which on GPT-2 stalls above the budget.
WEIGHT = 8.0
#: The weight that refuses every move past the budget (an excess costs infinitely).
HARD = float("inf")
#: Of `polish`'s time and moves, the share of the run within the budget when there
#: are two (the one that cannot fail to give a plan).
HARD_SHARE = 2 / 3
#: Where the search does not fit, it runs once more asked for this share of the budget
#: (`fastsa`): its objective prices the excess over what it is asked, so a lower target
#: pushes the peak further down (a 2-layer Llama asked 50% stopped at 58.1% of its
#: store-everything peak, asked 30% it reached 50.3%).
DEEPER_TARGET = 0.6


@dataclass
class Problem:
    """The kernel's arrays for one partition of the nodes into scheduling units."""
    arrays: tuple
    members: list[list[int]]        # unit -> graph nodes, in order
    unit_of: dict[int, int]         # graph node -> unit
    candidates: np.ndarray          # units whose occurrences may move

    def expand(self, units: list[int]) -> list[int]:
        return [n for u in units for n in self.members[u]]


def _csr(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(lists) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(x) for x in lists])
    idx = np.asarray([v for x in lists for v in x], dtype=np.int64)
    return ptr, idx


def build(tg: TrainingGraph, members: list[list[int]]) -> Problem:
    """The kernel's description of `tg` scheduled in units of `members` (each a list
    of graph nodes in execution order; every node in exactly one unit), laid out as
    `anneal.py`'s problem tuple."""
    g = tg.graph
    unit_of = {n: u for u, nodes in enumerate(members) for n in nodes}
    cost = np.asarray([sum(tg.time[n] for n in nodes) for nodes in members], dtype=np.float64)
    work = np.asarray([sum(g.node(n).cost.workspace_bytes for n in nodes) for nodes in members],
                      dtype=np.int64)
    inputs: list[list[int]] = [[] for _ in members]
    for u, nodes in enumerate(members):
        for n in nodes:
            for p in tg.node_inputs(n):
                if unit_of[p] != u and unit_of[p] not in inputs[u]:
                    inputs[u].append(unit_of[p])
    users: list[list[int]] = [[] for _ in members]
    for u, ins in enumerate(inputs):
        for i in ins:
            users[i].append(u)
    storages = _Storages(g, members, unit_of)
    movable = np.asarray([all(n in tg.recomputable for n in nodes) for nodes in members],
                         dtype=np.bool_)
    # A random node's first run draws the numbers later runs replay; a graph output's
    # producer must run in the forward, which hands its outputs over.
    pin_first = np.asarray([any(g.node(n).random or n in tg.output_nodes for n in nodes)
                            for nodes in members], dtype=np.bool_)
    readers = storages.readers
    rd_ptr = np.zeros(len(readers) + 1, dtype=np.int64)
    rd_ptr[1:] = np.cumsum([len(x) for x in readers])
    arrays = (cost, work, movable, pin_first, *_csr(inputs), *_csr(users),
              *_csr(storages.own), *_csr(storages.reads),
              np.asarray(storages.unit, dtype=np.int64),
              np.asarray(storages.bytes, dtype=np.int64),
              np.asarray(storages.pinned, dtype=np.bool_),
              np.asarray(storages.parent, dtype=np.int64), rd_ptr,
              np.asarray([r for x in readers for r, _ in x], dtype=np.int64),
              np.asarray([c for x in readers for _, c in x], dtype=np.int64))
    return Problem(arrays, members, unit_of, np.flatnonzero(movable).astype(np.int64))


class _Storages:
    """The storage units of a partition into scheduling units: one per (scheduling unit,
    non-resident storage its nodes output), with the bytes it allocates (none for a
    view of another unit's storage, whose allocation, its *parent*, it holds), whether
    it is a graph output, and who reads it from outside its scheduling unit (a read
    inside it ends with the unit's own run)."""

    def __init__(self, g: Graph, members: list[list[int]], unit_of: dict[int, int]):
        resident = {g.value(v).storage_id for v in g.resident_value_ids}
        key: dict[tuple[int, int], int] = {}
        self.unit: list[int] = []                       # storage unit -> scheduling unit
        self.bytes: list[int] = []
        self.own: list[list[int]] = [[] for _ in members]
        for u, nodes in enumerate(members):
            for n in nodes:
                node = g.node(n)
                fresh = new_storages(g, node)
                for v in node.outputs:
                    s = g.value(v).storage_id
                    if s in resident:
                        continue
                    k = key.setdefault((u, s), len(key))
                    if k == len(self.unit):
                        self.unit.append(u)
                        self.bytes.append(0)
                        self.own[u].append(k)
                    if s in fresh:
                        self.bytes[k] = g.storage_bytes(s)
        self.readers: list[list[tuple[int, int]]] = [[] for _ in key]
        self.parent = [-1] * len(key)
        self.reads: list[list[int]] = [[] for _ in members]     # scheduling unit -> storage units
        for r, nodes in enumerate(members):
            for n in nodes:
                for v in g.node(n).inputs:
                    s, producer = g.value(v).storage_id, g.producer(v)
                    if s in resident or producer is None or unit_of[producer] == r:
                        continue
                    k = key[(unit_of[producer], s)]
                    child = key.get((r, s), -1)
                    if child >= 0 and self.bytes[child]:
                        child = -1                      # r allocates s anew: not a view
                    if child >= 0 and self.parent[child] < 0:
                        self.parent[child] = k
                    elif child >= 0 and self.parent[child] != k:
                        child = -1      # a view holds one parent; other reads of s are reads
                    if all(reader != r for reader, _ in self.readers[k]):
                        self.readers[k].append((r, child))
                    if k not in self.reads[r]:
                        self.reads[r].append(k)
        self.pinned = [False] * len(key)
        for v in g.output_value_ids:
            s, producer = g.value(v).storage_id, g.producer(v)
            if producer is not None and s not in resident:
                self.pinned[key[(unit_of[producer], s)]] = True


def groups(tg: TrainingGraph) -> list[list[int]]:
    """Stage 1's units: each forward node merged into its only reader when its inputs
    take no more bytes than its outputs (the paper's rule); every other node alone.
    Merging into a node's only reader never makes a cycle (every path out of it goes
    through that reader). A random node whose draws depend on its inputs' values stays
    alone: merged, it would run where its reader does, and another such node merged into
    an earlier reader would draw before it, which no schedule may do (`ir/rng.py`)."""
    head = {n: n for n in tg.order}

    def find(n: int) -> int:
        while head[n] != n:
            head[n] = head[head[n]]
            n = head[n]
        return n

    for n in tg.forward:
        readers = set(tg.node_users[n])
        node = tg.graph.node(n)
        if n not in tg.recomputable or len(readers) != 1 or (node.random and not node.rng_shape_only):
            continue
        (reader,) = readers
        if reader not in tg.recomputable:
            continue
        inputs = sum(tg.memory[r] for r in {tg.root(p) for p in tg.node_inputs(n)})
        if inputs <= tg.memory[n]:
            head[find(n)] = find(reader)
    members: dict[int, list[int]] = {}
    for n in tg.order:
        members.setdefault(find(n), []).append(n)
    return sorted(members.values(), key=lambda nodes: tg.position[nodes[-1]])


def _placement(problem: Problem, units: list[int]) -> tuple[int, list[tuple[int, int]]]:
    size = 1
    while size < SPREAD * max(1, len(units)):
        size *= 2
    step = size // max(1, len(units))
    return size, [(u, i * step + step // 2) for i, u in enumerate(units)]


def _units_of(problem: Problem, sequence: list[int]) -> list[int]:
    """A node sequence as unit occurrences (a unit's nodes must come together, in order)."""
    units, i = [], 0
    while i < len(sequence):
        u = problem.unit_of[sequence[i]]
        size = len(problem.members[u])
        if sequence[i:i + size] != problem.members[u]:
            raise ValueError(f"node {sequence[i]} does not start its unit {problem.members[u]}")
        units.append(u)
        i += size
    return units


class _Search:
    """One annealing stage: runs the kernel in chunks, keeps the best sequences seen."""

    def __init__(self, problem: Problem, sequence: list[int], budget: int, weight: float,
                 deadline: Deadline, progress, label: str):
        self.problem, self.budget, self.weight, self.deadline = problem, budget, weight, deadline
        self.progress, self.label = progress, label
        self.place(_units_of(problem, sequence))
        self.best: tuple[float, list[int]] | None = None       # (time, node sequence) within budget
        self.lowest: tuple[int, list[int]] | None = None       # (peak, node sequence)
        self.moves = 0
        self.seconds = 0.0
        self.look()

    def place(self, units: list[int]) -> None:
        size, placement = _placement(self.problem, units)
        self.state = anneal.new_state(self.problem.arrays, size, placement)

    def compact(self) -> None:
        """Spread the occurrences over fewer slots once most recomputations of the start
        are gone (from recompute-everything, 95% of them): a smaller segment tree stays
        in cache, and moves run several times faster."""
        units = anneal.sequence(self.state)
        if len(units) * SPREAD * 4 <= len(self.state[anneal.SLOT]):
            self.place(units)

    @property
    def peak(self) -> int:
        return int(self.state[anneal.TREE][1])

    def look(self) -> None:
        peak, seconds = self.peak, float(self.state[anneal.TIME][0])
        if self.best is not None and peak <= self.budget and seconds >= self.best[0]:
            return
        if self.lowest is not None and peak >= self.lowest[0] and peak > self.budget:
            return
        nodes = self.problem.expand(anneal.sequence(self.state))
        if peak <= self.budget and (self.best is None or seconds < self.best[0]):
            self.best = (seconds, nodes)
        if self.lowest is None or peak < self.lowest[0]:
            self.lowest = (peak, nodes)

    def run(self, iterations: int, *, seed: int, stop_when_fits: bool) -> None:
        if iterations <= 0 or len(self.problem.candidates) == 0:
            return
        anneal.seed(seed)
        objective = anneal.objective(self.peak, float(self.state[anneal.TIME][0]), self.budget,
                                     self.weight)
        t_first, t_last = T_FIRST * objective, T_LAST * objective
        done = 0
        started = time.monotonic()
        while done < iterations and not self.deadline.expired():
            chunk = min(CHUNK, iterations - done)
            tried, _ = anneal.anneal(self.problem.arrays, self.state, self.problem.candidates,
                                     chunk, done, iterations, t_first, t_last, self.budget,
                                     self.weight, stop_when_fits)
            done += tried
            self.look()
            self.compact()
            if stop_when_fits and self.peak <= self.budget:
                break
            if tried < chunk:
                break
        self.moves += done
        self.seconds += time.monotonic() - started
        rate = done / max(1e-9, time.monotonic() - started)
        self.progress(f"fastsa: {self.label}: {done} moves ({rate:,.0f}/s), peak {self.peak} "
                      f"bytes, time {float(self.state[anneal.TIME][0]):.6g} s")


def fastsa(graph: Graph, budget: int | None, *, time_limit_s: float | None = None, progress=quiet,
           seed: int = 0, iterations: int | None = None, start: str = "",
           grouping: bool = True, weight: float = WEIGHT, deeper: bool = True) -> pb.Schedule:
    """Simulated annealing over compute sequences (Fast SA): groups, then single nodes.

    `iterations`: moves in all (default `default_iterations`); `start`: a solver
    whose plan stage 2 starts from (stage 1 is then skipped; with a time limit the
    start solver gets half of it); `seed`: the random moves' seed;
    `grouping=False` skips stage 1; `weight`: how an excess over the budget is
    priced (`anneal.objective`); `deeper=False`: no second search asked for less where
    the first finds nothing within the budget (`DEEPER_TARGET`)."""
    _check_options(seed, iterations, weight)
    everything = store_all(graph)
    if budget is None or everything.predicted_peak_bytes <= budget:
        everything.name = "fastsa"
        return everything
    deadline = Deadline(time_limit_s)
    tg = TrainingGraph(graph)
    total = iterations if iterations is not None else default_iterations(tg)
    if start:
        starts = [everything, *_start_plans(graph, budget, start, deadline, progress)]
        found = polish(tg, starts, budget, deadline=deadline, progress=progress,
                       iterations=total, seed=seed + 1, weight=weight)
        if found is None:
            lowest = min(starts, key=lambda s: s.predicted_peak_bytes)
            raise InfeasibleBudget(budget, lowest.predicted_peak_bytes, " (by fastsa)",
                                   schedule=lowest)
        return found
    sequence, stage1_moves = compute_sequence(everything), 0
    if grouping:
        problem = build(tg, groups(tg))
        progress(f"fastsa: {len(tg.order)} nodes in {len(problem.members)} groups, "
                 f"{len(problem.candidates)} movable")
        search = _Search(problem, problem.expand(range(len(problem.members))), budget, weight,
                         deadline, progress, "groups")
        search.run(total * 2 // 3, seed=seed, stop_when_fits=True)
        sequence = search.best[1] if search.best else search.lowest[1]
        stage1_moves = search.moves
    fits = search.best is not None if grouping else False
    search = _Search(build(tg, [[n] for n in tg.order]), sequence, budget,
                     HARD if fits else weight, deadline, progress, "nodes")
    search.run(total - stage1_moves, seed=seed + 1, stop_when_fits=False)
    found = _checked(tg, [search.best], budget) if search.best is not None else None
    if found is not None:
        return found
    lowest = _schedule(tg, search.lowest[1])
    if deeper and budget > 1 and not deadline.expired():
        # Once more asked for less (`DEEPER_TARGET`), in the time left: its lowest plan
        # may fit the budget, and else lowers the floor named.
        progress(f"fastsa: nothing within {budget} bytes; searching again asked for "
                 f"{DEEPER_TARGET:.0%} of it")
        try:
            return fastsa(graph, max(1, int(budget * DEEPER_TARGET)), progress=progress, seed=seed,
                          iterations=iterations, grouping=grouping, weight=weight, deeper=False,
                          time_limit_s=None if time_limit_s is None else deadline.remaining())
        except InfeasibleBudget as again:
            if again.schedule.predicted_peak_bytes <= budget:
                return again.schedule
            if again.schedule.predicted_peak_bytes < lowest.predicted_peak_bytes:
                lowest = again.schedule
    raise InfeasibleBudget(budget, lowest.predicted_peak_bytes, " (by fastsa)", schedule=lowest)


def _check_options(seed, iterations, weight) -> None:
    """Bad options are named here, not as a type error from inside the compiled kernel."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise BadRequest(f"fastsa: seed must be a non-negative integer, not {seed!r}")
    if iterations is not None and (isinstance(iterations, bool) or not isinstance(iterations, int)
                                   or iterations < 0):
        raise BadRequest(f"fastsa: iterations must be a non-negative integer, not {iterations!r}")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 1:
        raise BadRequest(f"fastsa: weight must be a number of at least 1 (1 is the paper's "
                         f"objective), not {weight!r}")


def default_iterations(tg: TrainingGraph) -> int:
    """Moves when none are asked for: `MOVES_PER_NODE` per node, within
    [`MIN_ITERATIONS`, `MAX_ITERATIONS`], the least lowered to
    `SMALL_GRAPH_MOVES_PER_NODE` per node on a small graph."""
    nodes = len(tg.order)
    least = min(MIN_ITERATIONS, SMALL_GRAPH_MOVES_PER_NODE * nodes)
    return min(MAX_ITERATIONS, max(least, MOVES_PER_NODE * nodes))


def polish(tg: TrainingGraph, starts: list[pb.Schedule], budget: int, *, deadline: Deadline,
           progress=quiet, iterations: int | None = None, seed: int = 1,
           weight: float = WEIGHT) -> pb.Schedule | None:
    """Anneal node by node from other solvers' plans (`starts`, within the budget or
    not); the fastest schedule within the budget found, or None.

    Two runs share the moves: from the fastest start within the budget, with no
    move past the budget accepted (a descent that drops what the budget lets it:
    from recompute-everything on GPT-2 at its least feasible budget it goes from
    29x to 1.5x store-everything's time); and, when the start with the best
    objective is over the budget (a fast plan just over it), from that one with
    the budget priced by `weight`."""
    starts = [s for s in starts if _occurrences(s) <= MAX_START_OCCURRENCES]
    if not starts:
        progress(f"fastsa: every start plan runs more than {MAX_START_OCCURRENCES} nodes; "
                 "not annealed")
        return None
    fitting = [s for s in starts if s.predicted_peak_bytes <= budget]
    runs = []
    if fitting:
        runs.append((min(fitting, key=lambda s: s.predicted_time_s), HARD))
    best_objective = min(starts, key=lambda s: anneal.objective(
        s.predicted_peak_bytes, s.predicted_time_s, budget, weight))
    if best_objective.predicted_peak_bytes > budget:
        runs.append((best_objective, weight))
    singles = build(tg, [[n] for n in tg.order])   # the same problem for both runs
    found: list[tuple[float, list[int]]] = []
    for k, (start, run_weight) in enumerate(runs):
        sequence = compute_sequence(start)
        total = iterations if iterations is not None else min(   # a start needs no minimum
            MAX_ITERATIONS, max(MOVES_PER_NODE * len(tg.order),
                                MOVES_PER_OCCURRENCE * len(sequence)))
        part = HARD_SHARE if len(runs) - k > 1 else 1.0
        share = Deadline(deadline.remaining() * part if deadline.seconds is not None else None)
        label = "nodes" if run_weight == HARD else "nodes, over the budget at first"
        search = _Search(singles, sequence, budget, run_weight, share, progress, label)
        moves = total if len(runs) == 1 else int(total * (HARD_SHARE if k == 0 else 1 - HARD_SHARE))
        search.run(moves, seed=seed + k, stop_when_fits=False)
        if search.best is not None:
            found.append(search.best)
    return _checked(tg, sorted(found), budget)


def _checked(tg: TrainingGraph, found: list[tuple[float, list[int]]], budget: int
             ) -> pb.Schedule | None:
    """The fastest of `found` whose simulated peak is within the budget. The kernel's peak
    is the simulator's except where one node reads two values of one storage made by two
    nodes (an in-place chain): it may then count less, and the simulator decides."""
    for _, sequence in found:
        schedule = _schedule(tg, sequence)
        if schedule.predicted_peak_bytes <= budget:
            return schedule
    return None


def _occurrences(schedule: pb.Schedule) -> int:
    return sum(1 for s in schedule.steps if s.WhichOneof("action") == "compute")


def _start_plans(graph: Graph, budget: int, solver: str, deadline: Deadline,
                 progress) -> list[pb.Schedule]:
    """`solver`'s plan for `budget`, or the lowest-peak plan it names when it refuses."""
    from . import solve  # the facade of this package: any solver, checked by the simulator
    limit = deadline.remaining() / 2 if deadline.seconds is not None else None
    try:
        return [solve(graph, budget, solver, time_limit_s=limit, progress=progress)]
    except InfeasibleBudget as refused:
        return [refused.schedule] if refused.schedule is not None else []


def _schedule(tg: TrainingGraph, sequence: list[int]) -> pb.Schedule:
    backward = set(tg.backward)
    forward_length = next((i for i, n in enumerate(sequence) if n in backward), len(sequence))
    return simulated_schedule(tg, sequence, forward_length, name="fastsa")[0]
