"""Facts about a training graph that several solvers share, computed once.

Solvers think in nodes: the node-level memory model (`remat_ir.ir.memory.
NodeMemory`) says what each node allocates and which node's allocation a view
node keeps alive (its *root*).
The forward pass is cut into *segments* at its articulation points: positions
of the forward order where the only activations crossing to later forward
nodes are the outputs of the node just computed (small side values such as an
attention mask are tolerated and travel with the boundary).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from remat_ir.ir import Graph, pb
from remat_ir.ir.memory import NodeMemory

#: A cut tolerates side values crossing it up to this share of its own crossing bytes.
SIDE_VALUE_SHARE = 0.25


@dataclass(frozen=True)
class Segment:
    """Forward nodes between two cuts, and the backward nodes that undo them."""
    index: int
    forward: tuple[int, ...]
    backward: tuple[int, ...]
    #: Bytes crossing the cut at the segment's end (what a checkpoint of its output keeps).
    boundary_bytes: int
    #: Earlier forward nodes whose results cross the cut at the segment's start (its input).
    inputs: frozenset[int] = frozenset()


class TrainingGraph(NodeMemory):
    """A graph seen as a solver sees it: the node-level memory model over the
    forward-then-backward order (`NodeMemory`), what may be recomputed, and the
    segment structure of the forward pass."""

    def __init__(self, graph: Graph):
        self.forward = graph.phase_order(pb.FORWARD)
        self.backward = graph.phase_order(pb.BACKWARD)
        super().__init__(graph, self.forward + self.backward)
        self.time = {n: graph.node(n).cost.time_s for n in self.order}

    # ------------------------------------------------------------------ nodes

    @cached_property
    def output_nodes(self) -> frozenset[int]:
        """Nodes producing a graph output: their results stay live to the end."""
        return frozenset(p for v in self.graph.output_value_ids
                         if (p := self.graph.producer(v)) is not None)

    @cached_property
    def recomputable(self) -> frozenset[int]:
        """Forward nodes that may run again in backward (random ones with RNG replay).

        A node producing a graph output may when each such output is a buffer update
        (BatchNorm's running statistics): run again, it gives the same values from
        the same inputs (backward reads buffers as they were before the step updated
        them), and what it returns stays live to the end anyway. It still runs in the
        forward, which must hand its outputs over (a solver that may leave a node
        out of the forward, as fastsa may, keeps it there). A node returning
        a user output may not: the caller holds that copy, so running it again frees
        nothing."""
        graph = self.graph
        return frozenset(n for n in self.forward
                         if not (graph.node(n).mutating or graph.node(n).non_recomputable)
                         and (n not in self.output_nodes or n in self._buffer_updaters))

    @cached_property
    def run_once(self) -> frozenset[int]:
        """Forward nodes that may not run again (mutating, non-recomputable, graph outputs
        other than buffer updates): a plan runs each once, in the forward, and keeps its
        results."""
        return frozenset(self.forward) - self.recomputable

    @cached_property
    def held_outputs(self) -> frozenset[int]:
        """Nodes producing a graph output that never run again: solvers hold all
        their results to the end. (A recomputable one holds only its graph outputs,
        `output_bytes`, to the end; the rest is freed and recomputed like any node's.)"""
        return self.output_nodes - self.recomputable

    @cached_property
    def _buffer_updaters(self) -> frozenset[int]:
        """Nodes all of whose graph outputs are buffer updates."""
        roles: dict[int, set[int]] = {}
        for o in self.graph.proto.outputs:
            if (p := self.graph.producer(o.value_id)) is not None:
                roles.setdefault(p, set()).add(o.role)
        return frozenset(n for n, r in roles.items() if r == {pb.BUFFER_UPDATE})

    @cached_property
    def needed_by_backward(self) -> frozenset[int]:
        """Forward nodes whose outputs some backward node reads."""
        fwd = set(self.forward)
        return frozenset(p for b in self.backward for p in self.node_inputs(b) if p in fwd)

    # --------------------------------------------------------------- segments

    @cached_property
    def cuts(self) -> list[int]:
        """Positions in the forward order after which the forward graph is (nearly) a chain link."""
        fwd = self.forward
        last_use: dict[int, int] = {}
        for i, n in enumerate(fwd):
            for p in self.node_inputs(n):
                last_use[p] = i
        # Sweep: nodes whose outputs are still needed by later forward nodes.
        open_nodes: set[int] = set()
        cuts = []
        for i, n in enumerate(fwd):
            open_nodes = {p for p in open_nodes if last_use[p] > i}
            if last_use.get(n, -1) > i:
                open_nodes.add(n)
            if i == len(fwd) - 1:
                cuts.append(i)
                continue
            own = self.memory[n] + (self.memory[self.view_root[n]] if n in self.view_root else 0)
            side = sum(self.memory[p] for p in open_nodes if p != n and p != self.view_root.get(n))
            if n in open_nodes and side <= SIDE_VALUE_SHARE * own:
                cuts.append(i)
        return cuts

    def _crossing(self, i: int) -> frozenset[int]:
        """Allocating nodes of the forward results computed at or before forward
        position i and read after it."""
        later = set(self.forward[i + 1:])
        return frozenset(self.root(p) for p in self.forward[:i + 1]
                         if any(u in later for u in self.node_users[p]))

    def crossing_bytes(self, i: int) -> int:
        """Bytes of forward results computed at or before forward position i and read after it."""
        return sum(self.memory[p] for p in self._crossing(i))

    @cached_property
    def segments(self) -> list[Segment]:
        """The forward order split at `cuts`, each with the backward nodes that belong to it.

        A backward node belongs to the latest segment whose forward results it
        reads, but never to a later segment than a backward node it depends on,
        so that running the segments' backward parts last-to-first respects
        every dependency. A backward node that reads, of that segment, only
        what crosses its end cut (the next segment's input, as the backward of
        a chain link reads the link's input) belongs to the next segment, as
        in rotor's chain, where a stage's backward reads the stage's input.
        Backward nodes that read no forward result go with their earliest
        backward dependency (the last segment if none).
        """
        bounds = [-1] + self.cuts
        seg_of: dict[int, int] = {}
        for k in range(len(bounds) - 1):
            for n in self.forward[bounds[k] + 1: bounds[k + 1] + 1]:
                seg_of[n] = k
        last = len(bounds) - 2
        entering = [self._crossing(bounds[k]) if k else frozenset() for k in range(last + 1)]
        bwd_seg: dict[int, int] = {}
        for b in self.backward:
            preds = self.node_inputs(b)
            limit = min((bwd_seg[p] for p in preds if p in bwd_seg), default=last)
            reads = [p for p in preds if p in seg_of]
            k = max((seg_of[p] for p in reads), default=limit)
            if k < limit and all(seg_of[p] < k or self.root(p) in entering[k + 1]
                                 for p in reads):
                k += 1
            bwd_seg[b] = min(k, limit)
        segments = []
        for k in range(last + 1):
            forward = tuple(self.forward[bounds[k] + 1: bounds[k + 1] + 1])
            backward = tuple(b for b in self.backward if bwd_seg[b] == k)
            segments.append(Segment(k, forward, backward, self.crossing_bytes(bounds[k + 1]),
                                    entering[k]))
        return segments
