"""Which forward ops pass a gradient back to their tensor arguments: autograd gives an op
an edge into each argument it differentiates, and none where its result carries no
gradient (`detach`, an integer `argmax`, a mask) or the op ignores its arguments' values
(`zeros_like`). Read where the order of a tensor's gradient parts matters: how many
parts autograd adds into a graph input (`frontends/gradient_buffers.py`), which readers
of a returned tensor add a part of its gradient (`runtimes/output_views.py`)."""

from __future__ import annotations

from .dtypes import DIFFERENTIABLE
from .graph import Graph
from . import remat_ir_pb2 as pb

#: Ops whose result carries no gradient back to their tensor arguments.
NO_EDGE_OPS = frozenset({
    "aten.detach.default", "aten.alias.default", "aten.sym_size.int", "aten.sym_stride.int",
    "aten.sym_numel.default", "aten.sym_storage_offset.default", "aten.empty_like.default",
    "aten.zeros_like.default", "aten.ones_like.default", "aten.full_like.default",
    "aten.rand_like.default", "aten.randn_like.default", "aten.randint_like.default",
})


def passes_gradient(graph: Graph, node: pb.Node) -> bool:
    """Whether `node` may pass a gradient back to its tensor arguments: an op with an edge
    to them and a result of a floating-point or complex type."""
    return node.op not in NO_EDGE_OPS and any(graph.value(v).dtype in DIFFERENTIABLE for v in node.outputs)
