"""Which of AOTAutograd's gradient sums add into a graph input's own gradient.

AOTAutograd marks every add its backward makes to sum a tensor's gradient contributions
(`is_gradient_acc`), whichever tensor: a parameter, an input, an activation read twice.
The runtime may hand the parts of an input's gradient to autograd instead of running its
sums (`ir.gradient_sums`, `runtimes/gradient_parts.py`), which is right only for the
sums of that input's own buffer. From the graph alone, that buffer's first sum cannot be
told from the gradient of another tensor handed to it whole: where the forward computes
`y = x + b` (or `x.clone()`), `y`'s summed gradient reaches `x` unchanged, and handing
`y`'s parts to `x` one by one would add them otherwise than eager, which adds `y`'s sum.
Eager's buffer of `x` adds once fewer times than autograd has edges into `x` that a
backward runs through, one per tensor argument of a differentiable forward op that reads
it and leads to a user output (`_edges`); so the walk back from
`x`'s gradient keeps that many sums marked and unmarks every other. A gradient that is
the cast back of autocast's cached cast of `x` (`Node.autocast_cast_back`) is summed in
the cast's buffer: the walk starts at the cast back's input and counts the edges into the
cast."""

from __future__ import annotations

from remat_ir.ir import Graph, pb
from remat_ir.ir.arguments import tensor_ids
from remat_ir.ir.dtypes import DIFFERENTIABLE
from remat_ir.ir.gradient_edges import NO_EDGE_OPS
from remat_ir.ir.gradient_sums import GRADIENT_ROLES


def _edges(graph: Graph) -> dict[int, int]:
    """Value id -> the edges autograd has into it from the forward's ops that a gradient
    runs through: each tensor argument that reads it, of an op with a floating-point
    result through which a user output is reached. An op whose result only leads to
    integers (`argmax`, a mask) has an edge in eager's graph that no backward runs: counted,
    the walk kept one sum too many per such edge and handed another tensor's summed
    gradient to the input in parts (`x + x` read only by `argmax`, beside a custom
    Function passing its summed gradient on: 9e-8 off eager's under bf16, found by a search)."""
    edges: dict[int, int] = {}
    reaching = {o.value_id for o in graph.proto.outputs
                if o.role == pb.USER_OUTPUT and graph.value(o.value_id).dtype in DIFFERENTIABLE}
    for node in reversed(graph.proto.nodes):
        if node.phase != pb.FORWARD:
            continue
        if not any(v in reaching and graph.value(v).dtype in DIFFERENTIABLE for v in node.outputs):
            continue
        arguments = [v for a in [*node.args, *(k.value for k in node.kwargs)] for v in tensor_ids(a)]
        # Reached through every op, those without an edge too (an `alias` the lowering
        # makes of a value eager's graph reads on): at worst an edge counted as before.
        reaching.update(arguments)
        if node.op not in NO_EDGE_OPS:
            for v in arguments:
                edges[v] = edges.get(v, 0) + 1
    return edges


def mark_input_gradient_sums(graph: Graph) -> None:
    """Keep `accumulates_gradient` on the sums of each graph input's own gradient buffer
    (the module docstring) and clear it everywhere else."""
    names = {e.name: e.value_id for e in graph.proto.inputs}
    edges = _edges(graph)
    # A parameter written in place under no_grad (`nn.Embedding(max_norm=...)`): its readers
    # after the write read the new value in the graph, the parameter itself in eager.
    written = {o.name: o.value_id for o in graph.proto.outputs if o.role == pb.BUFFER_UPDATE}
    keep: set[int] = set()
    for output in graph.proto.outputs:
        if output.role not in GRADIENT_ROLES or output.name not in names:
            continue
        value, tensor = output.value_id, names[output.name]
        back = graph.producer(value)
        if back is not None and graph.node(back).autocast_cast_back:
            value = graph.node(back).args[0].tensor
            tensor = next((graph.node(n).outputs[0] for n in graph.users(tensor)
                           if graph.node(n).phase == pb.FORWARD), tensor)
        sums = edges.get(tensor, 0) + edges.get(written.get(output.name), 0) - 1
        while sums > 0:
            producer = graph.producer(value)
            if producer is None or not graph.node(producer).accumulates_gradient:
                break
            keep.add(producer)
            value, sums = graph.node(producer).args[0].tensor, sums - 1
    for node in graph.proto.nodes:
        node.accumulates_gradient = node.id in keep
