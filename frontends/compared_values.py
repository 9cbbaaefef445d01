"""Values a step compares with each other, kept from the forward in a graph for a fusing
backend.

The backward of `amax`, `scatter_reduce(reduce="amax")`, `max` without indices and the
like finds where the maximum was with `eq(input, output)`: a gradient flows only where
the two are bitwise equal. Recomputed by the eager backend, a value has the forward's
bits. Inductor compiles a recomputation into another region than the forward value's,
fused otherwise, and its last bits may differ: the comparison then failed almost
everywhere and the gradients came out 5% off eager's, silently (found by a review:
`scatter_reduce` amax under recompute-all; a sum reduction or the eager backend were
exact). So, where a graph is lowered for a fusing backend, the forward nodes computing
what a comparison of two tensors reads are not recomputed (`Node.non_recomputable`):
both sides then hold the bits the forward computed, as in eager.
"""

from __future__ import annotations

from remat_ir.ir import Graph, pb
from remat_ir.ir.memory import is_view

#: Ops comparing two tensors elementwise, by their ATen name before the overload.
_COMPARISONS = frozenset({"aten.eq", "aten.ne", "aten.ge", "aten.gt", "aten.le", "aten.lt"})


def keep_compared_values(graph: Graph) -> list[int]:
    """Mark non-recomputable the forward nodes whose values (through views) a comparison
    of two tensors reads; returns their ids."""
    producer = {v: node for node in graph.proto.nodes for v in node.outputs}
    marked = []
    for node in graph.proto.nodes:
        if node.op.rpartition(".")[0] not in _COMPARISONS or len(node.inputs) < 2:
            continue
        for value in node.inputs:
            source = producer.get(value)
            while source is not None and is_view(graph, source) and source.inputs:
                source = producer.get(source.inputs[0])
            if source is not None and source.phase == pb.FORWARD and not source.non_recomputable:
                source.non_recomputable = True
                marked.append(source.id)
    return marked
