"""Schedules built from the graph alone: the two reference points every solver is
measured against, and the helper that turns any compute order into a schedule.

- `store_all`: what autograd does. Run forward once, keep every value backward
  needs, free everything else as soon as its last user has run.
- `recompute_all`: keep nothing for backward but the graph inputs (and what
  cannot be recomputed); backward recomputes the forward values it needs.

Both go through `from_compute_sequence`, which inserts a free after each
value's last use, so that solvers can also emit just a compute order.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import remat_ir_pb2 as pb
from .graph import Graph
from .memory import structure
from .simulator import SimulationResult, check


def compute_sequence(schedule: pb.Schedule) -> list[int]:
    """The nodes `schedule` computes, in order (recomputations included): the inverse of
    `from_compute_sequence`, where frees follow from the sequence."""
    return [step.compute for step in schedule.steps if step.HasField("compute")]


def forward_length(schedule: pb.Schedule) -> int:
    """How many of `compute_sequence(schedule)` run in the forward segment: with it, the
    `forward_length` that `from_compute_sequence` rebuilds the schedule from."""
    return sum(1 for step in schedule.steps[:schedule.backward_start] if step.HasField("compute"))


def from_compute_sequence(graph: Graph, sequence: Sequence[int], forward_length: int, *,
                          name: str, solver: str = "", rng_replay: bool = False) -> pb.Schedule:
    """Schedule that computes `sequence` in order and frees each value after its last use.
    See `simulated_compute_sequence`."""
    return simulated_compute_sequence(graph, sequence, forward_length, name=name, solver=solver,
                                      rng_replay=rng_replay)[0]


def simulated_compute_sequence(graph: Graph, sequence: Sequence[int], forward_length: int, *,
                               name: str, solver: str = "", rng_replay: bool = False,
                               ) -> tuple[pb.Schedule, SimulationResult]:
    """Schedule that computes `sequence` in order and frees each value after its last use,
    with the simulation that checked it (for callers that read its memory curve).

    A node may appear more than once (a recomputation). Each computation of a
    value lives until its last use before the next computation of the same
    value; resident values and graph outputs are never freed. The first
    `forward_length` computations (and the frees right after them) form the
    forward segment. The result is checked by the simulator before it is
    returned; an inconsistent sequence raises `InvalidSchedule`.
    """
    keep = graph.resident_value_ids | graph.output_value_ids
    # For each position: values whose life ends right after it.
    ends: list[list[int]] = [[] for _ in sequence]
    last_seen: dict[int, int] = {}  # value -> position of its latest definition or use
    known = structure(graph)
    for pos, node_id in enumerate(sequence):
        for v in known.inputs[node_id]:
            if v not in keep:
                last_seen[v] = pos
        for v in known.outputs[node_id]:
            if v in last_seen and v not in keep:  # redefined: the previous life ends
                ends[last_seen[v]].append(v)
            if v not in keep:
                last_seen[v] = pos
    for v, pos in last_seen.items():
        ends[pos].append(v)

    schedule = pb.Schedule(name=name, solver=solver or name, rng_replay=rng_replay,
                           status=pb.HEURISTIC)
    for pos, node_id in enumerate(sequence):
        schedule.steps.add(compute=node_id)
        for v in sorted(set(ends[pos])):
            schedule.steps.add(free=v)
        if pos + 1 == forward_length:
            schedule.backward_start = len(schedule.steps)
    if forward_length == 0:
        schedule.backward_start = 0
    result = check(graph, schedule)
    schedule.predicted_peak_bytes = result.peak_bytes
    schedule.predicted_time_s = result.total_time_s
    return schedule, result


def store_all(graph: Graph) -> pb.Schedule:
    """Autograd's schedule: forward once, keep what backward reads, no recomputation."""
    forward = graph.phase_order(pb.FORWARD)
    return from_compute_sequence(graph, forward + graph.phase_order(pb.BACKWARD),
                                 len(forward), name="store_all")


def recompute_all(graph: Graph) -> pb.Schedule:
    """Keep nothing across the forward/backward boundary that can be recomputed.

    Backward first recomputes, in forward order, every recomputable forward node
    whose results it needs (directly or to recompute another), then runs. User
    outputs are not recomputed: the caller holds them anyway.
    Outputs of mutating or non-recomputable nodes are kept from the forward;
    random nodes are recomputed with RNG replay.
    """
    forward = graph.phase_order(pb.FORWARD)
    backward = graph.phase_order(pb.BACKWARD)
    recomputable = {n for n in forward
                    if not (graph.node(n).mutating or graph.node(n).non_recomputable)}
    kept = {o.value_id for o in graph.proto.outputs if o.role == pb.USER_OUTPUT}
    needed: set[int] = set()
    frontier = [v for n in backward for v in graph.node(n).inputs if v not in kept]
    while frontier:
        producer = graph.producer(frontier.pop())
        if producer in recomputable and producer not in needed:
            needed.add(producer)
            frontier.extend(v for v in graph.node(producer).inputs if v not in kept)
    replay = [n for n in forward if n in needed]
    return from_compute_sequence(graph, forward + replay + backward, len(forward),
                                 name="recompute_all",
                                 rng_replay=any(graph.node(n).random for n in replay))
