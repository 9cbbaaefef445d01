"""Fused nodes: a pointwise chain that a compiling backend runs as one kernel, as one node.

Why: Inductor fuses a chain of pointwise ops (GELU's add, mul, tanh, ...) into one
kernel that reads the chain's inputs and writes its result, so the chain's
intermediates never exist in memory. A memory model that counts every op's output
makes the planner pay for those intermediates wherever the chain runs: keeping the
value before a GELU and recomputing the GELU in the backward looks as if it needed
the GELU's temporaries, so plans recompute a matrix product instead, which no
compiler fuses away. With the chain as one node, the planner sees what runs: the
node allocates its result, holds its inputs until it ends (a fused kernel frees
nothing before it finishes), and costs the sum of its members' times.

Which chains: a node joins the group of the nodes that read its outputs when every
reader is in that one group, in the same phase, and its outputs are not graph
outputs; so only a group's last node (its root) has readers outside it, the group's
outputs are the root's, and merging cannot make a cycle (a path out of a group
leaves from its root; one back into it would reach the root again). Which nodes may
join at all (pointwise, not random, not mutating) is the caller's to say: it depends
on what the backend compiles. Random nodes must never join: recomputing a fused node
replays no generator state.

A fused node takes its root's id, name and position; backward nodes that named a
member as their forward node name the fused node. Costs: the members' times summed,
no workspace (the kernel keeps intermediates in registers), FLOPs and bytes summed.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import remat_ir_pb2 as pb
from .errors import InvalidGraph
from .graph import Graph

#: The op of a fused node; its `body` holds the nodes it runs.
FUSED_OP = "remat_ir.fused"


def is_fused(node: pb.Node) -> bool:
    return node.op == FUSED_OP


def body_nodes(node: pb.Node) -> list[pb.Node]:
    """The nodes a node runs: its body for a fused node, else the node itself."""
    return list(node.body) if is_fused(node) else [node]


def fusion_groups(graph: Graph, fusable: Iterable[int]) -> list[list[int]]:
    """Groups of two or more `fusable` nodes, each in graph order, its root last
    (module docstring for the rule)."""
    fusable = set(fusable)
    outputs = graph.output_value_ids
    group_of: dict[int, int] = {}  # node -> its group's root
    members: dict[int, list[int]] = {}
    order = [n.id for n in graph.proto.nodes]
    for n in reversed(order):
        if n not in fusable:
            continue
        node = graph.node(n)
        readers = {u for v in node.outputs for u in graph.users(v)}
        roots = {group_of.get(u) for u in readers}
        root = next(iter(roots)) if len(roots) == 1 else None
        if (root is not None and not any(v in outputs for v in node.outputs)
                and graph.node(root).phase == node.phase):
            group_of[n] = root
            members[root].append(n)
        else:
            group_of[n] = n
            members[n] = [n]
    position = {n: i for i, n in enumerate(order)}
    return [sorted(m, key=position.__getitem__) for m in members.values() if len(m) > 1]


def fuse(graph: Graph, fusable: Iterable[int]) -> Graph:
    """A copy of `graph` (without its schedules and hierarchy, which name the nodes it
    replaces) in which each of `fusion_groups(graph, fusable)` is one fused node."""
    if len(graph.proto.schedules):
        raise InvalidGraph(["fuse() takes a graph before planning: its schedules name nodes "
                            "that fusing removes; fuse first, then plan"])
    proto = pb.Graph()
    proto.CopyFrom(graph.proto)
    del proto.schedules[:]
    proto.ClearField("hierarchy")
    groups = fusion_groups(graph, fusable)
    if not groups:
        return Graph(proto)
    by_root = {group[-1]: group for group in groups}
    fused_into = {m: group[-1] for group in groups for m in group}
    internal = {v for group in groups for m in group[:-1] for v in graph.node(m).outputs}
    nodes = []
    for node in graph.proto.nodes:
        root = fused_into.get(node.id)
        if root is None:
            copy = pb.Node()
            copy.CopyFrom(node)
            if copy.HasField("forward_node_id") and copy.forward_node_id in fused_into:
                copy.forward_node_id = fused_into[copy.forward_node_id]
            nodes.append(copy)
        elif root == node.id:
            nodes.append(_fused_node(graph, by_root[root], fused_into))
    del proto.nodes[:]
    proto.nodes.extend(nodes)
    values = proto.values
    for i in reversed(range(len(values))):  # no reference to an element is held across a delete
        if values[i].id in internal:
            del values[i]
    fused = Graph(proto)
    fused.drop_unused_storages()
    return fused


def _fused_node(graph: Graph, group: list[int], fused_into: dict[int, int]) -> pb.Node:
    """The node standing for `group` (`fused_into`: each fused member's group's root, to
    which the node's `forward_node_id` is carried as every other node's is: the root's
    forward node fused away left it naming a node the graph no longer has, which
    validation refuses)."""
    root = graph.node(group[-1])
    produced: set[int] = set()
    inputs: list[int] = []
    for m in group:
        for v in graph.node(m).inputs:
            if v not in produced and v not in inputs:
                inputs.append(v)
        produced.update(graph.node(m).outputs)
    members = [graph.node(m) for m in group]
    fused = pb.Node(id=root.id, name=root.name, op=FUSED_OP, inputs=inputs, outputs=list(root.outputs),
                    phase=root.phase, source=root.source)
    if root.HasField("forward_node_id"):
        fused.forward_node_id = fused_into.get(root.forward_node_id, root.forward_node_id)
    fused.cost.time_s = sum(m.cost.time_s for m in members)
    fused.cost.host_s = sum(m.cost.host_s for m in members)
    fused.cost.device_s = sum(m.cost.device_s for m in members)
    fused.cost.flops = sum(m.cost.flops for m in members)
    fused.cost.bytes_accessed = sum(m.cost.bytes_accessed for m in members)
    fused.cost.source = root.cost.source
    fused.body.extend(members)
    return fused


def body_problems(node: pb.Node, label: str) -> list[str]:
    """What is wrong with a fused node's body (`validation`): each member reads only the
    fused node's inputs and earlier members' outputs, the fused node's outputs are its
    members', and no member is random, mutating or itself fused."""
    if not is_fused(node):
        return [f"{label} has a body but is not a fused node (op {FUSED_OP!r})"] if len(node.body) else []
    if len(node.body) < 2:
        return [f"{label} is a fused node of {len(node.body)} node(s); fuse two or more"]
    problems = []
    available = set(node.inputs)
    for m in node.body:
        if m.random or m.mutating or is_fused(m):
            problems.append(f"{label}: member {m.name!r} ({m.op}) is random, mutating or fused, "
                            "which a fused node cannot run again as one kernel")
        missing = [v for v in m.inputs if v not in available]
        if missing:
            problems.append(f"{label}: member {m.name!r} ({m.op}) reads value ids {missing}, "
                            "which neither the fused node's inputs nor earlier members provide")
        available.update(m.outputs)
    not_made = [v for v in node.outputs if v not in available - set(node.inputs)]
    if not_made:
        problems.append(f"{label}: outputs {not_made} are not made by its members")
    return problems
