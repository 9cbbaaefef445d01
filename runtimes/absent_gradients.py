"""Outputs the loss leaves out: the backward runs none of what only they reach, as eager's.

Why: autograd never runs a part of the backward that only outputs the loss does not
read lead to. The step's backward is one planned segment, traced for every output's
gradient, and it used to run with zeros for the gradients the loss gave none. Zeros are
not nothing: a branch whose local derivative is infinite turns a zero into NaN (`sqrt`
at 0: 0 / 0), and a sum with zeros is another tensor than eager's (dense where eager's
gradient is an expanded one, so a bias gradient summed over it came out 6e-8 off; and
-0.0 + 0.0 is +0.0). A model returning `(h, sqrt(h * (h > 0)))`, trained on `h` alone,
got NaN in every gradient of `h`'s layer (found by a search, 2026-12-03;
`torch.compile`'s AOTAutograd does the same).

So the backward segment is generated for the outputs the loss leaves out (`Absent`;
`_Runner.backward_for` keeps one per such set, made at the first backward that needs it:
the usual set, none left out, is the plan's own segment and carries no extra line). A
backward node all of whose gradients are absent (None) is not run, and its results are
None. A sum of two gradients with one absent is the other one, the same tensor, as
eager's engine hands it on (a copy where a later write in place could reach it). Where
only some are absent (one op reading two outputs' gradients), those are zeros, as eager's
engine makes an undefined gradient zeros for such a node. The tangent of an output the
loss leaves out is then None (`_Step.begin`), and a parameter only such outputs reach
gets no gradient, as in eager.

Known when the code is generated, this holds for every backend and step kind alike:
Inductor's regions never see an absent value (a node reading one is a Python line
between regions), nor do offload copies (an absent value's transfers are not run). Found
wrong there before it was generated per set: the `sqrt` head above gave NaN under
`backend="inductor"` and with offloading (2026-12-04).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from remat_ir.ir import Graph, pb
from remat_ir.ir.errors import RematIRError
from remat_ir.ir.fusion import is_fused


def _gradient_sum(node: pb.Node, gradients: list[int], shape: Callable[[int], list[int] | None]) -> bool:
    """A plain sum of two gradients of the result's shape (how the joint graph adds a
    value's gradient contributions), or that sum written into one of them (`out=`,
    `frontends/buffer_reuse.py`). `shape(v)`: value `v`'s shape (None: not known)."""
    if node.op not in ("aten.add.Tensor", "aten.add.out") or len(gradients) != 2 or len(node.outputs) != 1:
        return False
    if any(kw.name == "alpha" for kw in node.kwargs) or len(node.args) > 2:
        return False
    result = shape(node.outputs[0])
    return result is not None and all(shape(v) == result for v in gradients)


def written_storages(graph: Graph, written: Callable[[pb.Node], set[int]]) -> dict[int, set[int]]:
    """Per storage some node writes in place (`written(node)`: the values it writes), the
    ids of those nodes; a graph output's storage counts as written by -1 (handed over or
    returned: one tensor must not be two)."""
    found: dict[int, set[int]] = {}
    for n in graph.proto.nodes:
        if n.mutating:
            for w in written(n):
                found.setdefault(graph.value(w).storage_id, set()).add(n.id)
    for o in graph.proto.outputs:
        found.setdefault(graph.value(o.value_id).storage_id, set()).add(-1)
    return found


class Absent:
    """Which gradient values of a backward segment are None when the loss leaves out the
    outputs it is generated for, followed step by step through the segment as it is
    generated (a value made zeros for one node is zeros for the nodes after it)."""

    def __init__(self, graph: Graph, tangents: list[int], is_gradient: Callable[[int], bool],
                 written: dict[int, set[int]], name: Callable[[int], str], zeros: Callable[[int], str]):
        """`tangents`: the tangent values of the outputs left out; `is_gradient(v)`:
        whether value `v` is computed from a tangent; `written`: `written_storages`;
        `name(v)`: the variable of value `v`; `zeros(v)`: an expression making zeros of
        its shape, dtype and device."""
        self.graph, self.is_gradient, self.written = graph, is_gradient, written
        self.name, self.zeros = name, zeros
        self.values: set[int] = set(tangents)

    def lines(self, node_id: int, call: Callable[[pb.Node], list[str]]) -> list[str] | None:
        """The lines running node `node_id` where it reads an absent gradient, as the
        module docstring says; None where it reads none (it runs as usual, in a region
        where the backend makes them). `call(member)`: the usual lines of the node, or of
        one member of a fused node."""
        node = self.graph.node(node_id)
        if not self.values.intersection(node.inputs):
            return None
        if is_fused(node):
            return self._fused(node_id, node, call)
        return self._one(node_id, node, call, self._graph_shape, self.is_gradient)

    def _graph_shape(self, v: int) -> list[int]:
        return list(self.graph.value(v).shape)

    def _one(self, node_id: int, node: pb.Node, call, shape, is_gradient) -> list[str]:
        """The lines of one op (a node, or a fused node's member) reading absent values
        (`values` updated: what it makes absent, and what it makes zeros no longer is)."""
        name, absent = self.name, self.values
        gradients = [v for v in dict.fromkeys(node.inputs) if is_gradient(v)]
        missing = [v for v in gradients if v in absent]
        if not missing:
            return call(node)
        if len(missing) == len(gradients):
            absent.update(node.outputs)
            return [f"{name(v)} = None" for v in node.outputs]
        if _gradient_sum(node, gradients, shape):
            (given,) = (v for v in gradients if v not in absent)
            out = node.outputs[0]
            copied = any(self.written.get(self.graph.value(v).storage_id, set()) - {node_id}
                         for v in (*gradients, out) if v in self.graph.values)
            return [f"{name(out)} = {name(given)}" + (".clone()" if copied else "")]
        if any(v not in self.graph.values for v in missing):
            raise RematIRError(
                f"node {node.name} ({node.op}, inside fused node {self.graph.node(node_id).name}) reads "
                "two gradients of which the loss leaves one out, and that one is a fused "
                "kernel's intermediate whose shape the graph does not record: its zeros cannot "
                "be made. Give the left-out outputs a gradient (add 0 * their sum to the "
                "loss), or lower and run with backend=\"eager\"")
        absent.difference_update(missing)
        return [f"{name(v)} = {self.zeros(v)}" for v in missing] + call(node)

    def _fused(self, node_id: int, node: pb.Node, call) -> list[str]:
        """A fused node's members one by one, each as `_one` says (an intermediate is a
        gradient where a member input is, and has the shape its inputs broadcast to), each
        intermediate deleted after the last member reading it; outputs left absent are
        None."""
        graph, body = self.graph, list(node.body)
        gradient: set[int] = set()
        shapes: dict[int, list[int] | None] = {}

        def shape(v: int) -> list[int] | None:
            return self._graph_shape(v) if v in graph.values else shapes.get(v)

        def is_gradient(v: int) -> bool:
            return self.is_gradient(v) if v in graph.values else v in gradient

        last_read = {v: i for i, m in enumerate(body) for v in m.inputs}
        lines: list[str] = []
        for i, member in enumerate(body):
            lines += self._one(node_id, member, call, shape, is_gradient)
            reads = [shape(v) for v in member.inputs]
            for v in member.outputs:
                if any(is_gradient(u) for u in member.inputs):
                    gradient.add(v)
                if v not in graph.values:
                    shapes[v] = (list(torch.broadcast_shapes(*reads))
                                 if reads and None not in reads else None)
            dead = [v for m in body for v in m.outputs if last_read.get(v) == i
                    and v not in graph.values and v not in self.values]
            if dead:
                lines.append(f"del {', '.join(self.name(v) for v in dead)}")
        return lines
