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

So each backward node that reads a gradient (a value computed from some output's
tangent) runs under a test (`lines`). Where every gradient it reads is absent (None), so
are its results. A sum of two gradients with one absent is the other one, the same
tensor, as eager's engine hands it on (a copy where a later write in place could reach
it). Where only some are absent (one op reading two outputs' gradients), those are
zeros, as eager's engine makes an undefined gradient zeros for such a node. The tangent
of an output the loss leaves out is then None (`_Step.begin`), and a parameter only such
outputs reach gets no gradient, as in eager.

Not done where the segment's values are not plain Python tensors or steps are timed
(`applies`): Inductor's regions, offloaded copies, timing. There the zeros stay.
"""

from __future__ import annotations

from collections.abc import Callable

from remat_ir.ir import Graph, pb


def applies(regions, copies, tick) -> bool:
    """Whether the generated backward treats absent gradients as this module says."""
    return regions is None and copies is None and tick is None


def _gradient_sum(graph: Graph, node: pb.Node, gradients: list[int]) -> bool:
    """A plain sum of two gradients of the result's shape (how the joint graph adds a
    value's gradient contributions), or that sum written into one of them (`out=`,
    `frontends/buffer_reuse.py`)."""
    if node.op not in ("aten.add.Tensor", "aten.add.out") or len(gradients) != 2 or len(node.outputs) != 1:
        return False
    if any(kw.name == "alpha" for kw in node.kwargs) or len(node.args) > 2:
        return False
    shape = list(graph.value(node.outputs[0]).shape)
    return all(list(graph.value(v).shape) == shape for v in gradients)


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


def lines(graph: Graph, node_id: int, is_gradient: Callable[[int], bool], call: list[str],
          name: Callable[[int], str], zeros: Callable[[int], str],
          written: dict[int, set[int]]) -> list[str]:
    """The lines running node `node_id` (`call`), with absent gradients as the module
    docstring says. `is_gradient(v)`: whether value `v` is computed from a tangent;
    `name(v)`: its variable; `zeros(v)`: an expression making zeros of its shape, dtype and
    device; `written`: `written_storages`."""
    node = graph.node(node_id)
    gradients = [v for v in dict.fromkeys(node.inputs) if is_gradient(v)]
    if not gradients:
        return call
    indented = ["    " + line for line in call]
    if _gradient_sum(graph, node, gradients):
        out, (a, b) = name(node.outputs[0]), gradients
        copied = any(written.get(graph.value(v).storage_id, set()) - {node_id}
                     for v in (a, b, node.outputs[0]))

        def other(v: int) -> str:
            return f"None if {name(v)} is None else {name(v)}.clone()" if copied else name(v)
        return [f"if {name(a)} is None:", f"    {out} = {other(b)}",
                f"elif {name(b)} is None:", f"    {out} = {other(a)}", "else:", *indented]
    absent = " and ".join(f"{name(v)} is None" for v in gradients)
    result = [f"if {absent}:", *(f"    {name(v)} = None" for v in node.outputs), "else:"]
    if len(gradients) > 1 or node.mutating:
        for v in gradients:
            result += [f"    if {name(v)} is None:", f"        {name(v)} = {zeros(v)}"]
    return result + indented
