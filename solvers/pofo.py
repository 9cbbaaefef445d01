"""`pofo`: rotor's chain dynamic program with offloading (Beaumont, Eyraud-Dubois,
Shilova, NeurIPS 2021, paper 003), on the graph's host link.

rotor's DP (`solvers/rotor.py`) chooses per stage to store its results for its
backward (one of several keep options), to checkpoint, or to recompute. POFO adds a
move to *store* a stage: its kept results are offloaded while the rest of the chain
runs and prefetched for its backward. The middle of the chain then runs without
those bytes, and the move costs the longer of the middle's time and the round trip
over the link (the two overlap on a copy stream; on a link that does not overlap,
their sum). This is the paper's principle in rotor's DP, not its full model: the
DP does not track the transfer channel, so two offloaded stages are priced as if
their copies did not queue behind each other.

The DP's plan becomes a schedule as rotor's does; then each offloaded stage's kept
values are given round trips over their idle gap into the stage's backward, or across
the forward/backward boundary when a later stage's backward reads them first
(`offload.idle_gaps`), placed for the queued copies
(`offload.place_round_trips`). The simulator prices the result exactly, and, as for rotor,
the DP's memory target is fitted until the simulated peak is within the budget.
rotor's plan (the DP without the move) is returned instead where it is faster: the
DP prices offloads without the channel's queue, so its plans can be slower than
planned.
"""

from __future__ import annotations

import math

from remat_ir.ir import Graph, pb, simulate
from remat_ir.ir.simulator import transfer_seconds

from .base import InfeasibleBudget, quiet
from .offload import idle_gaps, link_of, place_round_trips, with_round_trips
from .rotor import REPLANS, SLOTS, Chain, _Tables, chain_to_plan, rotor, sequence_of
from .sequences import fit_to_budget, to_schedule


def pofo(graph: Graph, budget: int | None, *, time_limit_s: float | None = None,
         progress=quiet) -> pb.Schedule:
    """Chain dynamic program with rematerialization and offloading (module docstring)."""
    link = link_of(graph)
    everything, chain = chain_to_plan(graph, budget, "pofo", progress)
    if chain is None:
        return everything

    def round_trip(nbytes: int) -> float:
        return 2 * transfer_seconds(link, nbytes) if nbytes else 0.0

    def plan_at(target: int, least: bool = False) -> pb.Schedule | None:
        tables = _Tables(chain, target, progress, round_trip, link.overlapped,
                         round_trip_host_s=2 * link.issue_s)
        m = tables.smallest() if least else tables.M
        if m is None or not tables.feasible(m):
            return None
        return _with_transfers(graph, chain, tables.operations(m), link)

    unit = max(1, math.ceil(max(0, budget - chain.pinned_bytes) / SLOTS))
    best = fit_to_budget(plan_at, budget, step=unit, replans=REPLANS, progress=progress,
                         label="pofo")
    # rotor's plan (the DP without the move) where it is faster, or where the DP's
    # offloads do not fit; else the least-memory plan of either.
    try:
        alone = rotor(graph, budget, progress=progress)
        return alone if best is None or alone.predicted_time_s < best.predicted_time_s else best
    except InfeasibleBudget as refused:
        if best is not None:
            return best
        frugal = plan_at(everything.predicted_peak_bytes, least=True) or everything
        if refused.schedule is not None and refused.smallest_feasible < frugal.predicted_peak_bytes:
            frugal = refused.schedule
    if frugal.predicted_peak_bytes <= budget:
        return frugal
    raise InfeasibleBudget(budget, frugal.predicted_peak_bytes, " (by pofo)", schedule=frugal)


def _with_transfers(graph: Graph, chain: Chain, ops: list[tuple], link: pb.HostLink) -> pb.Schedule:
    """The DP's plan as a checked schedule, each offloaded stage's kept values moved to
    the host between the end of its forward and the start of its backward."""
    sequence, forward_length, offloaded = sequence_of(chain, ops)
    base = to_schedule(chain.tg, sequence, forward_length, name="pofo")
    if offloaded:
        step_of = [k for k, s in enumerate(base.steps) if s.HasField("compute")]
        step_of.append(len(base.steps))
        stage_of = {n: s for s in offloaded for n in chain.stages[s].segment.forward}
        windows = {s: (step_of[end] - 1, step_of[start]) for s, (end, start) in offloaded.items()}
        result = simulate(graph, base)
        trips, seen = [], set()
        for o in idle_gaps(graph, base, result, link):
            producer = graph.producer(o.value)
            s = stage_of.get(producer)
            if s is None or (o.value, o.after) in seen:
                continue
            _, backward_start = windows[s]
            # idle into the stage's backward, or across the forward/backward boundary (a
            # later stage's backward may read it first)
            if o.after < backward_start <= o.use or o.after < base.backward_start <= o.use:
                trips.append(o)   # on time comes before late in idle_gaps' order
                seen.add((o.value, o.after))
        times = result.start_s + [result.forward_time_s + result.backward_time_s]
        base, _ = with_round_trips(base, place_round_trips(trips, times, link))
    checked = simulate(graph, base)
    base.predicted_peak_bytes, base.predicted_time_s = checked.peak_bytes, checked.total_time_s
    base.predicted_host_peak_bytes = checked.host_peak_bytes
    return base
