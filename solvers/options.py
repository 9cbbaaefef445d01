"""HiRemate's options: the ways one part of a graph (a node or a cluster) can run.

An option is a forward compute sequence and a backward compute sequence over
the part's own nodes (the backward one starts with whatever the option
recomputes). Everything a parent needs to know about it is *measured* from
those two sequences, so that options from any source (the base options, an
H-ILP solution, a leaf solver) are described the same way:

- forward and backward time (the backward time includes its recomputation);
- `saved`: bytes of the part's own results kept from its forward to its
  backward (its outputs excepted: the parent holds those), of each only what
  backward nodes read (a dropout keeps its mask);
- `forward_peak`: bytes the part's forward allocates at its highest point
  (its outputs and saved results included);
- `backward_peak`: bytes its backward allocates beyond `saved` at its
  highest point (recomputed results, gradients it produces);
- `reads`: forward results its backward reads that are not its own saved
  results (its inputs, its own outputs): the parent must have them there.

The peaks come from the node-level memory model (`NodeMemory.walk` in
`remat_ir.ir.memory`): a node's results are held or freed together through
their root, where the simulator frees per storage; `saved` and the partial
keeps follow the storages backward reads. The top-level plan is then fitted
to the simulator (`fit_to_budget`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .sequences import OnDemand
from .structure import TrainingGraph


@dataclass(frozen=True)
class PartOption:
    forward: tuple[int, ...]
    backward: tuple[int, ...]
    forward_time: float
    backward_time: float
    saved: int
    forward_peak: int
    backward_peak: int
    reads: frozenset[int]
    #: (saved allocation, bytes of it the backward reads) pairs.
    saved_roots: tuple[tuple[int, int], ...] = ()

    @property
    def time(self) -> float:
        return self.forward_time + self.backward_time


class PartShape:
    """What options of one part are measured against: its own forward nodes and
    the ones of them whose results are read outside it (its outputs)."""

    def __init__(self, tg: TrainingGraph, forward: Sequence[int], backward: Sequence[int]):
        self.tg = tg
        self.forward = tuple(forward)
        self.backward = tuple(backward)
        self.own = frozenset(forward)
        inside = self.own | set(backward)
        self.outputs = frozenset(n for n in forward if n in tg.held_outputs
                                 or any(u not in inside for u in tg.node_users[n]))
        self.root = tg.root
        #: Allocations of its outputs (the parent holds them, even through a view).
        self.output_roots = frozenset(self.root(n) for n in self.outputs)
        #: Allocations outside the part that its nodes reach through views.
        self.outside = frozenset(self.root(n) for n in forward if self.root(n) not in self.own)

    def measure(self, forward: Sequence[int], backward: Sequence[int]) -> PartOption:
        tg, root = self.tg, self.root
        forward_nodes = set(tg.forward)
        computed: set[int] = set()
        read_before: set[int] = set()
        for n in backward:
            read_before.update(p for p in tg.node_inputs(n)
                               if p in forward_nodes and p not in computed)
            computed.add(n)
        saved_nodes = {n for n in read_before if n in self.own and n not in self.outputs}
        saved_roots = {root(n) for n in saved_nodes if root(n) in self.own} - self.output_roots
        kept = {r: tg.bytes_read(r, backward) for r in saved_roots}
        saved = sum(kept.values())
        # A saved view of an output or of an outside result keeps that result alive:
        # the parent must hold it, so the backward reads it.
        reads = (read_before - saved_nodes) | {root(n) for n in saved_nodes
                                               if root(n) not in saved_roots}
        forward_peak, _ = tg.walk(set(), list(forward), set(self.outputs),
                                  self.outside, kept)
        backward_peak = self.backward_peak(backward, kept)
        return PartOption(tuple(forward), tuple(backward), sum(tg.time[n] for n in forward),
                      sum(tg.time[n] for n in backward), saved, forward_peak,
                      max(0, backward_peak - saved), frozenset(reads), tuple(kept.items()))

    def backward_peak(self, backward: Sequence[int], saved_roots: Mapping[int, int],
                      dying: frozenset[int] = frozenset()) -> int:
        """Bytes the backward allocates at its highest point, from its saved results
        and those of `dying` (results held before it and freed by it: the last reader
        of a gradient, an output read for the last time) that it reads. Whatever
        else it reads is held all along (counted apart)."""
        tg, root = self.tg, self.root
        produced = set(backward)
        # What leaves the backward: gradients read by later nodes, parameter gradients.
        leaving = {b: tg.output_bytes[b] + tg.bytes_read(b, [u for u in tg.node_users[b]
                                                             if u not in produced])
                   for b in backward if b in tg.output_nodes
                   or any(u not in produced for u in tg.node_users[b])}
        read = {root(p) for n in backward for p in tg.node_inputs(n) if p not in produced}
        dying = frozenset(dying & read) - saved_roots.keys()
        apart = frozenset(read - saved_roots.keys() - dying)
        peak, _ = tg.walk(set(saved_roots) | dying, list(backward), leaving, apart,
                          saved_roots)
        return peak - sum(tg.memory[r] for r in dying)

    def base_options(self) -> list[PartOption]:
        """Store what the backward reads (autograd); and keep nothing, recomputing
        in the backward what it reads (outputs are the parent's to hold)."""
        store = self.measure(self.forward, self.backward)
        sequence: list[int] = []
        builder = OnDemand(self.tg, (set(self.tg.forward) - self.own) | self.outputs, sequence)
        for b in self.backward:
            builder.run(b)
        nothing = self.measure(self.forward, sequence)
        return [store] if nothing.saved >= store.saved else [store, nothing]


def pareto(options: list[PartOption]) -> list[PartOption]:
    """Options no other option beats on time, saved bytes and both peaks at once."""
    def key(o: PartOption):
        return (o.time, o.saved, o.forward_peak, o.backward_peak)

    unique = {key(o): o for o in sorted(options, key=key, reverse=True)}
    ordered = sorted(unique.values(), key=key)
    kept: list[PartOption] = []
    for o in ordered:
        if not any(k.time <= o.time and k.saved <= o.saved and k.forward_peak <= o.forward_peak
                   and k.backward_peak <= o.backward_peak for k in kept):
            kept.append(o)
    return kept


def spread(options: list[PartOption], cap: int) -> list[PartOption]:
    """At most `cap` options with saved bytes as diverse as possible: the most and
    least saving always, then the ones filling the widest gaps in saved bytes."""
    if len(options) <= cap:
        return list(options)
    by_saved = sorted(options, key=lambda o: (o.saved, o.time))
    chosen = [by_saved[0], by_saved[-1]]
    rest = by_saved[1:-1]
    while len(chosen) < cap and rest:
        values = sorted(o.saved for o in chosen)
        best = max(rest, key=lambda o: min(abs(o.saved - v) for v in values))
        chosen.append(best)
        rest.remove(best)
    return sorted(chosen, key=lambda o: o.saved)
