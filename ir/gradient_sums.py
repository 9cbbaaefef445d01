"""Chains of sums that make a gradient output from its parts.

Where a graph reads a tensor (a parameter, an input) more than once, its gradient is
the sum of its readers' contributions. The PyTorch frontend marks the adds that make
such sums `accumulates_gradient` (AOTAutograd's, in the order eager's autograd adds the
contributions into its buffer: the first input is the sum so far, the second the part
that arrives next). A runtime that hands gradients to an autograd engine may hand the
parts over one by one instead of running the chain (`runtimes/gradient_parts.py`), so
that the engine adds them to parts from outside the graph in eager's order; passes
that rewrite nodes leave the chains' sums as they are (`frontends/buffer_reuse.py`).

A gradient output may instead be the cast back of autocast's cached cast of the input
(`Node.autocast_cast_back`): the chain then sums the cast's gradient, and ends in the
cast back's input (`cast_backs`)."""

from __future__ import annotations

from collections import Counter

from . import remat_ir_pb2 as pb
from .graph import Graph

#: The roles of the outputs that are gradients of graph inputs.
GRADIENT_ROLES = (pb.PARAMETER_GRADIENT, pb.INPUT_GRADIENT)


#: The op of a cast back (`Node.autocast_cast_back`): the torch frontend's cast, with a
#: `dtype` argument, of the gradient of autocast's cached cast back to the input's dtype.
CAST_BACK_OP = "aten._to_copy.default"


def is_cast_back(node: pb.Node) -> bool:
    """Whether `node` is marked a cast back and is one: a runtime hands autograd the
    node's input in place of its result, which only a dtype cast makes equal (found by a
    review: an `aten.t` marked so in a file handed over a weight's gradient transposed,
    up to 1.04 off, without a word; `ir.validation` refuses such a mark)."""
    return (node.autocast_cast_back and node.op == CAST_BACK_OP and len(node.outputs) == 1
            and len(node.args) == 1 and node.args[0].HasField("tensor")
            and any(k.name == "dtype" for k in node.kwargs))


def _is_sum(node: pb.Node) -> bool:
    return (node.accumulates_gradient and node.op == "aten.add.Tensor" and len(node.outputs) == 1
            and len(node.args) == 2 and all(a.HasField("tensor") for a in node.args)
            and not node.kwargs)


def chain(graph: Graph, gradient: int) -> tuple[list[int], list[int]] | None:
    """(the sum nodes, first to last; the parts in arrival order) of a gradient made by a
    chain of sums, or None. A running sum that something else reads too ends the chain
    there (it must be made: it is then the first part), as does one the next sum also adds
    as its arriving part (`x + x`: the sum of a gradient with itself; with the chain run on
    through it, the sum making it was left out and it was handed over unmade, a NameError
    inside the step, found by a search)."""
    nodes, arriving = [], []
    value, reader = gradient, None
    while True:
        producer = graph.producer(value)
        if producer is None or not _is_sum(graph.node(producer)):
            break
        if reader is not None and (graph.users(value) != [reader]
                                   or graph.node(reader).args[1].tensor == value):
            break
        node = graph.node(producer)
        nodes.append(producer)
        arriving.append(node.args[1].tensor)
        value, reader = node.args[0].tensor, producer
    if not nodes:
        return None
    return nodes[::-1], [value] + arriving[::-1]


def _handed_whole(graph: Graph) -> list[int]:
    """The gradient outputs a runtime may hand over otherwise than as computed: each output
    once and read by no node."""
    times = Counter(o.value_id for o in graph.proto.outputs)
    return [o.value_id for o in graph.proto.outputs
            if o.role in GRADIENT_ROLES and times[o.value_id] == 1 and not graph.users(o.value_id)]


def gradient_chains(graph: Graph) -> dict[int, tuple[list[int], list[int]]]:
    """Gradient output value -> (its chain's sum nodes, first to last; its parts in
    arrival order), for each gradient output that is made by such a chain, is output
    once and read by no node."""
    chains = {}
    for value in _handed_whole(graph):
        found = chain(graph, value)
        if found is not None:
            chains[value] = found
    return chains


def handed_sums(graph: Graph) -> set[int]:
    """The sum nodes a runtime may hand over in parts instead of running: those of the
    gradient outputs' chains and of the chains that end in a cast back's input. Passes
    that rewrite nodes leave them as they are (an `out=` sum is no sum: the chain of a
    weight that three products read under autocast broke there, and a module called
    twice in one block summed its parts in another order, 7e-3 off eager's)."""
    sums = {n for nodes, _ in gradient_chains(graph).values() for n in nodes}
    for back in cast_backs(graph).values():
        found = chain(graph, graph.node(back).args[0].tensor)
        sums.update(found[0] if found else ())
    return sums


def cast_backs(graph: Graph) -> dict[int, int]:
    """Gradient output value -> the cast back node that makes it, for each gradient output
    made by one (`Node.autocast_cast_back`), output once and read by no node."""
    producers = {value: graph.producer(value) for value in _handed_whole(graph)}
    return {value: node for value, node in producers.items()
            if node is not None and is_cast_back(graph.node(node))}


def handed_sum_values(graph: Graph) -> set[int]:
    """The running sums `handed_sums` make: values a runtime may never make, which a
    schedule must therefore neither move nor compute twice (`moved_sums`)."""
    return {v for n in handed_sums(graph) for v in graph.node(n).outputs}


def moved_sums(graph: Graph, schedule: pb.Schedule) -> set[int]:
    """The results of `handed_sums` (and of the cast backs their chains end in) that
    `schedule` offloads, prefetches or computes more than once: no runtime can hand
    their chains over in parts (solvers never make such plans; `solvers/offload.py` once
    did, before 2026-12-02)."""
    backs = set(cast_backs(graph).values())
    sums = handed_sums(graph) | backs
    values = handed_sum_values(graph) | {v for n in backs for v in graph.node(n).outputs}
    computed = Counter(s.compute for s in schedule.steps if s.HasField("compute") and s.compute in sums)
    moved = {getattr(s, a) for s in schedule.steps for a in ("offload", "prefetch") if s.HasField(a)}
    return (moved & values) | {v for n, times in computed.items() if times > 1
                               for v in graph.node(n).outputs}


def moved_sum_problem(graph: Graph, schedule: pb.Schedule) -> str | None:
    """What `schedule` does to a running gradient sum that no runtime can run (`moved_sums`),
    said; None where nothing. Why checked where a schedule is accepted (`solve`, `remat-ir
    validate`): the simulator does not model handing sums over, so a plugin's plan
    recomputing one passed both, and was refused only at the first training call (hunt68)."""
    moved = sorted(moved_sums(graph, schedule))
    if not moved:
        return None
    value = moved[0]
    offloaded = any(s.HasField("offload") and s.offload == value for s in schedule.steps)
    return (f"it {'offloads' if offloaded else 'recomputes'} value {value} "
            f"({graph.value(value).name or 'unnamed'}), a running sum of a gradient, which a "
            f"runtime hands to autograd in parts and can neither move nor recompute"
            f"{f' ({len(moved) - 1} more such values)' if len(moved) > 1 else ''}")

