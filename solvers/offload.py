"""Offloading: bring a schedule under a budget by moving idle values to host memory.

Rematerialization pays for memory with compute; offloading pays with transfers
over the host link (`Provenance.host_link`), which a CUDA copy stream overlaps with
compute (paper 003, POFO). Two pieces, both on the simulator's rules
(docs/schedules.md):

- `add_offloads` takes any valid schedule and, while its peak is over the budget,
  picks values that are live but idle at the peak step (between two of their uses)
  and offloads them there: offload right after the use before the gap, free once
  the copy is predicted complete, prefetch early enough that the copy is back
  before the next use, with the copies queued on the link's channels (`place_round_trips`).
  Each round re-simulates, so queueing, stalls and shared storages are counted
  exactly, and is kept only if it lowers the bytes over the budget summed over the
  steps without raising the peak; it stops when the peak fits or no idle value
  covers the peak step. Its other move is a recomputation (`idle_recomputations`):
  free an idle value after a read and compute it again before the next, where its
  producer's inputs are still there. Copies that come back in time go first (they
  cost no compute), then recomputations (per second of compute), then copies that
  come back late (compute waits). Why: late in the backward everything offloaded
  early must come back over one channel, and the values read there pile up on the
  device waiting for their reads; a plan from a higher rematerialization budget
  then stalls at its last percent of excess, where recomputing a few cheap results
  does not (the U-Net at 25% over PCIe 4, GPU-priced: 0.76 of rematerialization's
  overhead with copies alone, 0.61 to 0.71 with both over three runs, as plans at the
  rungs differ; benchmarks/results/offload.md). A round
  takes no move that would take away an input of a recomputation where it runs
  (`_clash`): one such move makes the whole round invalid. The rounds also run with
  copies alone, and the faster result is kept: a recomputation taken early can hold
  on the device an input that a later round had to move. Rounds overshoot
  (they cover the excess at one step with whole values): recomputations the budget
  does not need are dropped again, and so are round trips where compute waits.
- `plan_with_offload` runs a rematerialization solver at a ladder of budgets
  between the target and the store-everything peak (and at the solver's floor
  when the target is below it), offloads each plan down to the target, and keeps
  the fastest: less recomputation bought with transfers where that is cheaper.
  Budgets below rematerialization's least peak become feasible this way. The
  ladder is then refined around its fastest rung (`REFINE_LEVELS`): what a link
  can hide is bounded by the bytes it moves while the forward runs, so the best
  rematerialization budget is the highest one whose excess the link still clears
  without stalls, and on a slow link that lies between two coarse rungs (GPT-2 12
  layers at 25% over PCIe 4, GPU-priced: 0.75 of rematerialization's overhead from
  the coarse ladder, 0.65 refined; benchmarks/results/offload.md). A floor plan the
  solver refused is offloaded too, but not refined around.

A value is offloaded only over a gap where no other value holding its storage is live
(a view would keep the storage on the device, and the prefetch allocate it again);
graph outputs, resident values and running gradient sums (`_movable_values`) never are.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, replace

from remat_ir.ir import Graph, pb, simulate, store_all
from remat_ir.ir.gradient_sums import handed_sum_values
from remat_ir.ir.simulator import SimulationResult, transfer_seconds

from .base import BadRequest, Deadline, InfeasibleBudget, Progress, quiet
from .budgets import parse_bandwidth
from .rotor import OutOfTime

#: Ratio between successive rematerialization budgets `plan_with_offload` tries.
LADDER_STEP = 1.25
#: Times `plan_with_offload` halves the ladder's step (in log scale) around its fastest
#: rung, trying the budgets on both sides of it each time: one more remat plan per side
#: and level, each of which may be the fastest.
REFINE_LEVELS = 2
#: A prefetch is placed to end this many of its own transfer times before the use (a
#: little slack for stalls that shift compute).
PREFETCH_MARGIN = 1.1
#: Round trips (the largest first) `add_offloads` tries to drop again once the budget is
#: met, where compute waits for copies.
TRIM_TRIES = 40


@dataclass(frozen=True)
class RoundTrip:
    """One offload of a value over an idle gap of a base schedule (`idle_gaps`):
    move `value` out after base step `after`, free it before base step `free_at`,
    prefetch it before base step `prefetch_at`; its next use is base step `use`. `late`:
    the prefetch comes too late for its copy to end before the use: compute will wait."""
    value: int
    after: int
    free_at: int
    prefetch_at: int
    use: int
    size: int
    late: bool = False


@dataclass(frozen=True)
class Recompute:
    """Instead of keeping `value` over an idle gap of a base schedule, free it before base
    step `after` + 1 and compute its producer `node` again right before base step `use`
    (its next read), freeing the node's `others` outputs at once (they are not live
    there in the base). What offloading cannot reach it covers with compute: late in the
    backward, where no copy could come back in time, a cheap result whose inputs are
    still there costs `time_s` and frees `size` bytes over the gap."""
    value: int
    node: int
    after: int
    use: int
    size: int
    time_s: float
    others: tuple[int, ...] = ()


def place_round_trips(trips: list[RoundTrip], times: list[float], link: pb.HostLink) -> list[RoundTrip]:
    """The round trips with frees and prefetches placed for the transfers queued together:
    offloads in order on the device-to-host channel, each freed at the first step after
    its copy ends; prefetches placed latest first on the host-to-device channel (each ends
    before its use and before the next prefetch starts), late ones right before their use.
    Where the channel cannot bring a value back in time its prefetch comes right after
    its free, and compute will wait: the simulation prices that against what it saves."""
    if not link.overlapped:
        return trips
    channel, free_at = 0.0, {}
    for o in sorted(trips, key=lambda o: (o.after, o.value)):
        channel = max(channel, times[o.after + 1]) + transfer_seconds(link, o.size)
        free_at[o] = max(o.free_at, bisect.bisect_left(times, channel, lo=o.after + 1))
    placed, start = [], float("inf")
    for o in sorted(trips, key=lambda o: (-o.use, o.value)):
        if o.late:   # brought back right before its use on purpose
            placed.append(replace(o, free_at=min(free_at[o], o.use - 1)))
            continue
        start = min(start, times[o.use]) - PREFETCH_MARGIN * transfer_seconds(link, o.size)
        prefetch_at = min(o.prefetch_at, bisect.bisect_right(times, start, hi=o.use) - 1)
        free = min(free_at[o], o.use - 1)
        placed.append(replace(o, free_at=free, prefetch_at=max(prefetch_at, free + 1)))
    return placed


def _excess(result: SimulationResult, budget: int) -> int:
    """Bytes over the budget, summed over the steps: what each round must lower (the peak
    alone may stay where it is while it moves to another step)."""
    return sum(m - budget for m in result.memory_during if m > budget)


def link_of(graph: Graph) -> pb.HostLink:
    """The graph's host link, or a clear error when offloading cannot be planned."""
    link = graph.proto.provenance.host_link
    if link.bandwidth_bytes_per_s <= 0:
        raise BadRequest("offloading needs the host link's bandwidth, and this graph describes "
                         "none: give it, as remat(..., host_bandwidth='25GB/s') or the CLI's "
                         "--host-bandwidth 25GB/s, or let the profiler measure it on the device "
                         "(cost_model='profile', remat()'s default)")
    return link


def describe_link(graph: Graph, bandwidth, *, latency_s: float = 1e-5) -> pb.HostLink:
    """Record a user-given host link in the graph (`bandwidth`: bytes per second or
    "25GB/s"): a link to a device's host, whose transfers overlap compute (the PyTorch
    runtime on CPU copies synchronously whatever the graph says)."""
    link = graph.proto.provenance.host_link
    link.bandwidth_bytes_per_s = parse_bandwidth(bandwidth)
    link.latency_s, link.overlapped, link.source = latency_s, True, "given"
    return link


def _movable_values(graph: Graph) -> set[int]:
    """Values an offload (or an idle recomputation) may move: counted activations that are
    not graph outputs, nor running sums of a gradient that a runtime hands to autograd in
    parts (`handed_sum_values`: it adds them in eager's order, with what the tensor gets from
    outside the graph; moved, the sum would have to be made by the graph and would round
    otherwise)."""
    resident = graph.resident_storage_ids
    sums = handed_sum_values(graph)
    return {v.id for v in graph.proto.values if v.storage_id not in resident
            and v.id not in graph.resident_value_ids and v.id not in graph.output_value_ids
            and v.id not in sums}


def _idle_spans(graph: Graph, steps: list[pb.Step], values: set[int]):
    """The idle spans of `values` in a schedule without transfers: (value, a, b) for
    every two consecutive steps a < b that make a copy of the value live or read it; and
    per storage the (value, first, last step) of each copy of those values."""
    uses: dict[int, list[int]] = {}     # value -> positions that make it live or read it
    lives: dict[int, list[tuple[int, int, int]]] = {}   # storage -> (value, first, last step)
    spans: list[tuple[int, int, int]] = []

    def close(v: int, last: int) -> None:
        positions = uses.pop(v, [])
        if positions:
            lives.setdefault(graph.value(v).storage_id, []).append((v, positions[0], last))
            spans.extend((v, a, b) for a, b in zip(positions, positions[1:]))

    for k, step in enumerate(steps):
        if step.HasField("compute"):
            node = graph.node(step.compute)
            for v in node.inputs:
                if v in uses:
                    uses[v].append(k)
            for v in node.outputs:
                if v in values:
                    close(v, k)
                    uses[v] = [k]
        elif step.HasField("free") and step.free in uses:
            close(step.free, k)
    for v in list(uses):
        close(v, len(steps))
    return spans, lives


def _alone(graph: Graph, lives, value: int, first: int, last: int) -> bool:
    """No other value holding `value`'s storage is live from step `first` to `last` (a
    view would keep the storage on the device, and bringing the value back allocate it
    again)."""
    return all(other == value or end < first or start > last
               for other, start, end in lives[graph.value(value).storage_id])


def idle_gaps(graph: Graph, schedule: pb.Schedule, base: SimulationResult | None = None,
              link: pb.HostLink | None = None) -> list[RoundTrip]:
    """Every idle gap of every movable value in the base schedule where an offload, free,
    prefetch round trip fits alone: the free after the offload's predicted end, the
    prefetch early enough that its copy ends before the next use (`PREFETCH_MARGIN`);
    and the same gap with the prefetch right before the use (`late`: the value stays off
    the device longer, and compute waits for its copy),
    and no other value holding the same storage live from the free to the prefetch (a
    view would keep the storage on the device, and the prefetch allocate it again).
    Transfers queued together only narrow these windows (`place_round_trips`)."""
    steps = list(schedule.steps)
    base = base or simulate(graph, schedule)
    link = link or link_of(graph)
    times = base.start_s + [base.forward_time_s + base.backward_time_s]
    spans, lives = _idle_spans(graph, steps, _movable_values(graph))
    gaps: list[RoundTrip] = []
    for v, a, b in spans:
        size = graph.storage_bytes(graph.value(v).storage_id)
        seconds = transfer_seconds(link, size)
        if not link.overlapped:
            free_at, prefetch_at = a + 1, b
        else:
            free_at = bisect.bisect_left(times, times[a + 1] + seconds, lo=a + 1)
            prefetch_at = bisect.bisect_right(times, times[b] - PREFETCH_MARGIN * seconds, hi=b) - 1
        free_at = min(free_at, b - 1)
        if not a + 1 <= free_at < b:
            continue
        if free_at < prefetch_at:
            gaps.append(RoundTrip(v, a, free_at, prefetch_at, b, size))
        if prefetch_at < b:  # back just when needed: longer off the device, compute waits
            gaps.append(RoundTrip(v, a, free_at, b, b, size, late=True))
    return [o for o in gaps if _alone(graph, lives, o.value, o.free_at, o.prefetch_at)]


def idle_recomputations(graph: Graph, schedule: pb.Schedule) -> list[Recompute]:
    """Every idle gap of every movable value in the base schedule that a recomputation
    can bridge: the value's producer may run again (not random, mutating or flagged
    non-recomputable), each of its inputs is resident or live in the base at the next
    read, its other outputs are movable and not live there (they are freed right
    after), and no other value holding the value's storage is live over the gap."""
    steps = list(schedule.steps)
    movable = _movable_values(graph)
    spans, lives = _idle_spans(graph, steps, movable)
    resident = graph.resident_value_ids
    live: dict[int, list[tuple[int, int]]] = {}    # every value -> (computed at, freed at)
    started: dict[int, int] = {}
    for k, step in enumerate(steps):
        if step.HasField("compute"):
            for v in graph.node(step.compute).outputs:
                started.setdefault(v, k)    # computed again while live: one copy on
        elif step.HasField("free") and step.free in started:
            live.setdefault(step.free, []).append((started.pop(step.free), k))
    for v, k in started.items():
        live.setdefault(v, []).append((k, len(steps)))

    def live_at(v: int, k: int) -> bool:
        return v in resident or any(s < k < e for s, e in live.get(v, ()))

    found = []
    for v, a, b in spans:
        n = graph.producer(v)
        if n is None or b - a < 2:
            continue
        node = graph.node(n)
        if node.random or node.mutating or node.non_recomputable:
            continue
        others = tuple(w for w in node.outputs if w != v)
        if (any(not live_at(u, b) for u in node.inputs)
                or any(w not in movable or live_at(w, b) for w in others)
                or not _alone(graph, lives, v, a + 1, b)):
            continue
        found.append(Recompute(v, n, a, b, graph.storage_bytes(graph.value(v).storage_id),
                               node.cost.time_s, others))
    return found


def with_round_trips(schedule: pb.Schedule, chosen: list[RoundTrip],
                     recomputes: list[Recompute] = ()) -> tuple[pb.Schedule, list[int]]:
    """The schedule with the chosen round trips and recomputations, and the base step
    each of its steps belongs to (inserted steps belong to the step they come before or
    after)."""
    steps = list(schedule.steps)
    before: dict[int, list[pb.Step]] = {}
    after: dict[int, list[pb.Step]] = {}
    for o in chosen:
        after.setdefault(o.after, []).append(pb.Step(offload=o.value))
        before.setdefault(o.free_at, []).append(pb.Step(free=o.value))
    for r in recomputes:
        before.setdefault(r.after + 1, []).append(pb.Step(free=r.value))
    # frees before prefetches (memory goes before more comes); prefetches by use;
    # recomputations last (an input may be arriving)
    for o in sorted(chosen, key=lambda o: (o.use, o.value)):
        before.setdefault(o.prefetch_at, []).append(pb.Step(prefetch=o.value))
    for r in sorted(recomputes, key=lambda r: (r.use, r.value)):
        before.setdefault(r.use, []).extend([pb.Step(compute=r.node)]
                                            + [pb.Step(free=w) for w in r.others])
    out = pb.Schedule()
    out.CopyFrom(schedule)
    del out.steps[:]
    owner: list[int] = []
    for k in range(len(steps) + 1):
        if k == schedule.backward_start:
            out.backward_start = len(out.steps)
        for s in before.get(k, ()):
            out.steps.append(s)
            owner.append(min(k, len(steps) - 1))
        if k == len(steps):
            break
        out.steps.append(steps[k])
        owner.append(k)
        for s in after.get(k, ()):
            out.steps.append(s)
            owner.append(k)
    return out, owner


def _clash(graph: Graph, a: RoundTrip | Recompute, b: RoundTrip | Recompute) -> bool:
    """Whether one of two moves takes away a value the other's recomputation reads
    where it runs (right before its `use`)."""
    def takes(m: RoundTrip | Recompute, r: Recompute) -> bool:
        if m.value not in graph.node(r.node).inputs:
            return False
        if isinstance(m, Recompute):   # computed again right before m.use, maybe after r
            return m.after < r.use <= m.use
        return m.free_at <= r.use < m.prefetch_at
    return ((isinstance(b, Recompute) and takes(a, b))
            or (isinstance(a, Recompute) and takes(b, a)))


def add_offloads(graph: Graph, schedule: pb.Schedule, budget: int, *,
                 host_budget: int | None = None, recompute: bool = True,
                 progress: Progress = quiet) -> pb.Schedule:
    """`schedule` with offloads (and, with `recompute`, recomputations of idle values
    where no copy comes back in time) that bring its peak within `budget` (see the module
    docstring); raises InfeasibleBudget with the lowest peak it reached otherwise.

    With `recompute` the rounds run twice, with both moves and with copies alone, and
    the faster result is kept: a recomputation taken early can hold an input on the
    device that a later round needed to move (a chain of six at 60% over a slow link:
    copies alone fit, both moves got stuck 800 bytes over), so both moves are never
    worse than copies alone."""
    link = link_of(graph)
    if any(s.HasField("offload") or s.HasField("prefetch") for s in schedule.steps):
        raise BadRequest(f"schedule {schedule.name!r} already moves values to the host")
    base = simulate(graph, schedule)
    if not base.valid:
        raise BadRequest(f"schedule {schedule.name!r} is invalid: {base.violation}")
    copies: list[RoundTrip | Recompute] = idle_gaps(graph, schedule, base, link)
    move_sets = [copies + idle_recomputations(graph, schedule), copies] if recompute else [copies]
    found, refusals = [], []
    for gaps in move_sets:
        try:
            found.append(_offload_rounds(graph, schedule, budget, base, gaps, link,
                                         host_budget=host_budget, progress=progress))
        except InfeasibleBudget as refused:
            refusals.append(refused)
    if not found:
        raise min(refusals, key=lambda r: r.smallest_feasible)
    return min(found, key=lambda s: (s.predicted_time_s if s is not schedule else base.total_time_s))


def _offload_rounds(graph: Graph, schedule: pb.Schedule, budget: int, base: SimulationResult,
                    gaps: list[RoundTrip | Recompute], link: pb.HostLink, *,
                    host_budget: int | None, progress: Progress) -> pb.Schedule:
    """One run of `add_offloads`' rounds over the moves `gaps` (with recomputations or
    copies alone), from the base schedule's simulation `base`."""
    steps = list(schedule.steps)
    times = base.start_s + [base.forward_time_s + base.backward_time_s]
    chosen: list[RoundTrip | Recompute] = []
    refused: set[RoundTrip | Recompute] = set()
    current, result = schedule, base
    owner = list(range(len(steps)))   # per step of `current`, the base step it stands for

    def build(moves: list[RoundTrip | Recompute]) -> tuple[pb.Schedule, list[int]]:
        """The base schedule with `moves` placed together, under the host budget."""
        trips = [o for o in moves if isinstance(o, RoundTrip)]
        built, owner = with_round_trips(schedule, place_round_trips(trips, times, link),
                                        [r for r in moves if isinstance(r, Recompute)])
        if host_budget is not None:
            built.host_budget_bytes = host_budget
        return built, owner

    def span(o: RoundTrip | Recompute) -> range:
        """The base steps over which the move frees the value's bytes."""
        return range(o.after + 1, o.use) if isinstance(o, Recompute) else range(o.free_at, o.prefetch_at)

    def order(o: RoundTrip | Recompute, excess: int, over: set[int]) -> tuple[int, float]:
        """Copies that come back in time first (they cost no compute), then
        recomputations, then late copies (compute waits); within each, bytes freed at
        the peak step x over-budget steps covered, per second of transfer or compute."""
        covered = min(o.size, excess) * sum(1 for i in span(o) if i in over)
        if isinstance(o, Recompute):
            return 1, -covered / max(o.time_s, 1e-9)
        return (2 if o.late else 0), -covered / transfer_seconds(link, o.size)

    while True:
        if result.peak_bytes <= budget:
            break
        k = owner[result.peak_step]
        during = result.memory_during
        over = {owner[i] for i, m in enumerate(during) if m > budget}
        # A gap offloaded on time may be taken again late (off the device longer).
        taken = set(chosen)
        fits = [o for o in gaps if k in span(o) and o not in refused and o not in taken]
        if not fits:
            current.predicted_peak_bytes = result.peak_bytes
            raise InfeasibleBudget(budget, result.peak_bytes, " (by offloading)", schedule=current)
        # The best-ordered moves that together cover the excess at the peak step.
        excess = result.peak_bytes - budget
        fits.sort(key=lambda o: order(o, excess, over))
        batch, covered, gaps_in_batch = [], 0, set()
        for o in fits:
            if covered >= excess:
                break
            if (o.value, o.after) not in gaps_in_batch and not any(
                    _clash(graph, o, c) for c in batch + chosen if (c.value, c.after) != (o.value, o.after)):
                batch.append(o)
                gaps_in_batch.add((o.value, o.after))
                covered += o.size
        if not batch:   # every fitting move clashes with one taken
            refused.update(fits)
            continue
        kept = [o for o in chosen if (o.value, o.after) not in gaps_in_batch]
        trial, owner_trial = build(kept + batch)
        trial_result = simulate(graph, trial)
        if (not trial_result.valid or trial_result.peak_bytes > result.peak_bytes
                or _excess(trial_result, budget) >= _excess(result, budget)):
            # over the host budget, an input moved away, or queued transfers leave no
            # room: fewer, or others
            if len(batch) == 1:
                refused.add(batch[0])
            else:
                refused.update(batch[len(batch) // 2:])
            continue
        chosen = kept + batch
        current, result, owner = trial, trial_result, owner_trial
        if len(chosen) % 25 < len(batch):
            progress(f"offload: {len(chosen)} values moved, peak {result.peak_bytes} bytes "
                     f"(budget {budget})")
    if result.stall_s > 0:   # copies queue up: drop the round trips the budget does not need
        for o in sorted(chosen, key=lambda o: -o.size)[:TRIM_TRIES]:
            kept = [c for c in chosen if c != o]
            trial, _ = build(kept)
            trial_result = simulate(graph, trial, budget=budget)
            if trial_result.valid and trial_result.total_time_s < result.total_time_s:
                chosen, current, result = kept, trial, trial_result
    if chosen:
        current.name = f"{schedule.name}+offload"
        current.predicted_peak_bytes = result.peak_bytes
        current.predicted_time_s = result.total_time_s
        current.predicted_host_peak_bytes = result.host_peak_bytes
    return current


def coarse_rungs(budget: int, ceiling: int) -> list[int]:
    """The ladder's budgets: from `budget` up by `LADDER_STEP`, below `ceiling` (the
    store-everything peak)."""
    rungs, b = [], float(budget)
    while b < ceiling:
        rungs.append(int(b))
        b *= LADDER_STEP
    return rungs


def plan_with_offload(graph: Graph, budget: int, remat: Callable[..., pb.Schedule], *,
                      host_budget: int | None = None, refine_levels: int = REFINE_LEVELS,
                      time_limit_s: float | None = None, progress: Progress = quiet) -> pb.Schedule:
    """The fastest of: `remat(b)` offloaded down to `budget`, for b on a ladder from
    `budget` up to the store-everything peak, then on finer steps around the fastest
    rung (`refine_levels`; module docstring). `remat` raises InfeasibleBudget below its
    floor, whose schedule is then one more starting point.

    `time_limit_s` bounds the whole call, as it bounds one solver's: each plan is then
    asked for as `remat(b, time_limit_s=share)`, its share being the time left over the
    plans still to make, and no plan is started once the time is spent (the fastest
    start so far is kept). Why: a limit handed whole to each of up to a dozen plans
    multiplies it (GPT-2 12 layers at 25% over PCIe 4 planned for 173 s with 30 s per
    plan), where a user reads it as the call's."""
    link_of(graph)
    deadline = Deadline(time_limit_s)
    everything = store_all(graph)
    ceiling = everything.predicted_peak_bytes
    lowest, lowest_peak = None, None     # the lowest-peak plan met (and its peak), for a refusal
    best, best_time, best_rung = None, float("inf"), None
    tried: set[int] = set()
    #: The steps of every plan offloaded so far: below the solver's floor every rung gets
    #: the same least-memory plan (rotor's on the tiny U-Net at 30%: five rungs), whose
    #: offloading, the same every time, was half the ladder's time.
    offloaded_steps: set[bytes] = set()

    def note(refused: InfeasibleBudget) -> None:
        nonlocal lowest, lowest_peak
        if refused.schedule is not None and (lowest is None or refused.smallest_feasible < lowest_peak):
            lowest, lowest_peak = refused.schedule, refused.smallest_feasible

    def offloaded(start: pb.Schedule, rung: int | None) -> None:
        """Offload `start` down to the budget; keep it if fastest. `rung`: the budget it
        was planned at, None for a plan the solver refused to call within its budget
        (its floor plan: rungs around one below the floor would give floor plans again)."""
        nonlocal best, best_time, best_rung
        steps = b"".join(step.SerializeToString(deterministic=True) for step in start.steps)
        if steps in offloaded_steps:   # offloaded as fast before: best stays as it is
            return
        offloaded_steps.add(steps)
        try:
            planned = add_offloads(graph, start, budget, host_budget=host_budget, progress=progress)
        except InfeasibleBudget as refused:
            note(refused)
            return
        time_s = simulate(graph, planned).total_time_s
        progress(f"offload: from {start.name or 'a plan'}{f' at {rung} bytes' if rung else ''}: "
                 f"{time_s:.4g} s predicted")
        if time_s < best_time:
            best, best_time, best_rung = planned, time_s, rung

    def start_at(rung: int, plans_left: int) -> None:
        """Plan at `rung` and offload the plan; `plans_left`: this plan and those after it,
        which share the time left."""
        if deadline.expired():
            return
        tried.add(rung)
        try:
            start = (remat(rung) if time_limit_s is None
                     else remat(rung, time_limit_s=deadline.remaining() / plans_left))
        except InfeasibleBudget as refused:
            note(refused)
            if refused.schedule is not None:   # a start, but not a rung to refine around
                offloaded(refused.schedule, None)
            return
        except OutOfTime:
            # Its share of the time was too short for this rung (rotor's program over many
            # stages): no start here, as for a refusal. Raised, it failed the whole plan
            # with a limit the caller never set (found by a review: "within 0.0434 s").
            progress(f"offload: no plan at {rung} bytes within its share of the time")
            return
        offloaded(start, rung)

    offloaded(everything, ceiling)
    rungs = coarse_rungs(budget, ceiling)
    refining = 2 * max(0, refine_levels)  # at most two probes a level
    for i, rung in enumerate(rungs):
        start_at(rung, len(rungs) - i + refining)
    for level in range(1, refine_levels + 1):
        if best_rung is None:
            break
        factor = LADDER_STEP ** (0.5 ** level)
        centre = best_rung
        for j, rung in enumerate((int(centre * factor), int(centre / factor))):
            if budget <= rung < ceiling and rung not in tried:
                start_at(rung, 2 * (refine_levels - level + 1) - j)
    if best is None:
        # Which peak it names: the lowest its plans reached toward this budget, not a
        # floor searched for. A review read it as one: 30% was refused naming 52.6%,
        # while 45% planned at 44.9%. And a host budget may be what stopped it, where
        # the refusal blamed rematerialization.
        host = (f"; under a host budget of {host_budget:,} bytes, which may be what stops "
                f"it: a larger host budget may plan lower" if host_budget is not None else "")
        # Not where the step's outputs alone exceed the budget: no plan goes below them.
        outputs = graph.output_bytes()
        floor = sum(n for role, n in outputs.items() if role != pb.BUFFER_UPDATE)
        between = "; a budget between the two may still plan" if budget >= floor else ""
        raise InfeasibleBudget(budget, lowest_peak,
                               f" (by rematerialization with offloading: the lowest peak its "
                               f"plans reached toward this budget, not a floor searched for"
                               f"{between}{host})", schedule=lowest)
    return best
