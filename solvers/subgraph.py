"""A part of a training graph as a training graph of its own.

HiRemate asks other solvers for a cluster's options (`leaves.py`). Any solver
reads a whole IR graph, so a cluster is cut out as one: its forward and
backward nodes with the ids they have in the full graph (a schedule of the
part names the full graph's nodes, nothing to map back), where

- what its nodes read from outside becomes a graph input: a forward result
  from outside is a user input (resident all along: the parent holds it), a
  gradient from outside an output gradient (there from the backward on);
- what its nodes make that is read outside, or is an output of the full
  graph, becomes a graph output: forward results as user outputs (live to the
  end: the parent holds them), gradients as input gradients; the full
  graph's own outputs keep their roles and names.

Cut out alone, a part's peak is rarely where its saved results are: its
outputs and its backward's gradients dominate, so a solver given a lower peak
budget finds nothing cheaper to drop. Inside the full graph, the rest of the
network runs between the part's forward and its backward and fills memory
there. `context_bytes` puts that in: a forward node `remat.context_forward`
reads the part's outputs and makes `context_bytes` bytes that the backward
node `remat.context_backward` turns into the gradients the part's backward
reads from outside. With the context larger than anything inside the part,
the peak falls where the context and the saved results meet, and a peak
budget is a budget on the bytes the part saves for its backward.

The part's schedules are proposals only: what they cost inside the full graph
is measured there (`options.PartShape.measure`).
"""

from __future__ import annotations

from collections.abc import Sequence

from remat_ir.ir import Graph, pb, validate
from remat_ir.ir.graph import RESIDENT_KINDS, referenced_value_ids


#: Ops of the context nodes (planned, never run).
CONTEXT_OPS = ("remat.context_forward", "remat.context_backward")


def part_graph(graph: Graph, forward: Sequence[int], backward: Sequence[int], name: str,
               context_bytes: int = 0) -> Graph:
    """The nodes `forward` + `backward` of `graph` as a valid graph of their own, with
    the rest of the network between them as `context_bytes` bytes (0: none)."""
    kept = set(forward) | set(backward)
    nodes = [n for n in graph.proto.nodes if n.id in kept]
    produced = {v for n in nodes for v in n.outputs}
    value_ids = list(dict.fromkeys(v for n in nodes
                                   for v in (*n.inputs, *n.outputs, *referenced_value_ids(n))))

    proto = pb.Graph(name=name)
    proto.version.CopyFrom(graph.proto.version)
    for v in value_ids:
        value = proto.values.add()
        value.CopyFrom(graph.value(v))
        if v not in produced and value.kind not in RESIDENT_KINDS:
            p = graph.producer(v)
            backward_result = p is not None and graph.node(p).phase == pb.BACKWARD
            value.kind = pb.GRADIENT if backward_result else pb.USER_INPUT
    for s in dict.fromkeys(graph.value(v).storage_id for v in value_ids):
        # At the bytes the full graph counts (rounded to its allocator's granularity): the
        # part carries no provenance, so its storages hold what allocating them takes.
        proto.storages.add(id=s, size_bytes=graph.storage_bytes(s))
    for n in nodes:
        node = proto.nodes.add()
        node.CopyFrom(n)
        if node.HasField("forward_node_id") and node.forward_node_id not in kept:
            node.ClearField("forward_node_id")

    entries = {i.value_id: i for i in graph.proto.inputs}
    for v in value_ids:
        if v in produced or graph.value(v).kind == pb.CONSTANT:
            continue
        entry = proto.inputs.add(value_id=v, name=graph.value(v).name)
        if v in entries:
            entry.CopyFrom(entries[v])
            if entry.gradient_of not in value_ids:
                entry.ClearField("gradient_of")
    # A part is called by nobody: its user inputs (the model's, and the values cut from
    # the rest of it) are numbered in input order, only to keep the graph valid.
    kinds = {v.id: v.kind for v in proto.values}
    user = [i for i in proto.inputs if kinds[i.value_id] == pb.USER_INPUT]
    for position, entry in enumerate(user):
        entry.user_input_position = position
    for entry in proto.inputs:
        if kinds[entry.value_id] != pb.USER_INPUT:
            entry.ClearField("user_input_position")
            entry.argument_name = ""
    outputs: dict[int, list[pb.GraphOutput]] = {}
    for o in graph.proto.outputs:
        outputs.setdefault(o.value_id, []).append(o)
    for v in value_ids:
        if v not in produced:
            continue
        if v in outputs:
            for o in outputs[v]:
                proto.outputs.add().CopyFrom(o)
        elif any(u not in kept for u in graph.users(v)):
            forward_result = graph.node(graph.producer(v)).phase == pb.FORWARD
            proto.outputs.add(value_id=v, name=graph.value(v).name,
                              role=pb.USER_OUTPUT if forward_result else pb.INPUT_GRADIENT)
    if context_bytes:
        _add_context(Graph(proto), graph, set(forward), context_bytes)
    return validate(proto)


def _add_context(part: Graph, graph: Graph, forward: set[int], context_bytes: int) -> None:
    """The context nodes: after the part's forward (reading its outputs, or its last
    result), before the backward that reads gradients from outside (making them)."""
    proto = part.proto
    forward_outputs = [o.value_id for o in proto.outputs if o.role == pb.USER_OUTPUT
                       and part.producer(o.value_id) in forward]
    if not forward_outputs:
        last = [n for n in part.topological_order if n in forward][-1]
        forward_outputs = list(part.node(last).outputs[:1])
    outside = [i.value_id for i in proto.inputs if part.value(i.value_id).kind == pb.GRADIENT
               and graph.producer(i.value_id) is not None]
    if not outside:   # a context gradient nothing reads, returned so that it is made
        outside = [part.add_value("context_gradient", "uint8", (1,), kind="gradient")]
        part.add_output(outside[0], "input_gradient", "context_gradient")
    kept = [i for i in proto.inputs if i.value_id not in outside]
    del proto.inputs[:]
    proto.inputs.extend(kept)
    context = part.add_value("context", "uint8", (context_bytes,))
    before = part.add_node(CONTEXT_OPS[0], forward_outputs, [context], phase="forward",
                           name="context_forward")
    after = part.add_node(CONTEXT_OPS[1], [context], outside, phase="backward",
                          name="context_backward")
    # Orders follow file positions among ready nodes (Graph.topological_order): the
    # context's backward first, so that no backward node runs while the context is there
    # (a solver that fixes the order, as Checkmate does, would hold what it reads).
    nodes = [n for n in proto.nodes if n.id not in (before, after)]
    ordered = ([part.node(after)] + [n for n in nodes if n.phase == pb.FORWARD]
               + [part.node(before)] + [n for n in nodes if n.phase == pb.BACKWARD])
    copies = [pb.Node() for _ in ordered]
    for copy, node in zip(copies, ordered):
        copy.CopyFrom(node)
    del proto.nodes[:]
    proto.nodes.extend(copies)


def compute_sequences(schedule: pb.Schedule, forward: Sequence[int],
                      backward: Sequence[int]) -> tuple[list[int], list[int]] | None:
    """A part's schedule as the forward and backward compute sequences of a HiRemate
    option (the context nodes left out): the forward runs each of the part's
    `forward` nodes once (a result it recomputes within the forward is kept
    instead), the backward runs the rest. None when the schedule runs a backward
    node before its backward starts."""
    own = set(forward)
    part = own | set(backward)
    computed = [(k, step.compute) for k, step in enumerate(schedule.steps)
                if step.WhichOneof("action") == "compute" and step.compute in part]
    ahead = [n for k, n in computed if k < schedule.backward_start]
    if any(n not in own for n in ahead):
        return None
    first_run = list(dict.fromkeys(ahead))
    if set(first_run) != own:
        return None
    return first_run, [n for k, n in computed if k >= schedule.backward_start]
