"""Outputs that are views of another output: taken again on the output handed over.

Why: AOTAutograd gives the joint graph no tangent for a user output that views another
user output (`return y, y.t()`; CLIP's `logits_per_image`, the transpose of
`logits_per_text`); its runtime wrapper rebuilds the view outside the graph, so that
autograd sends the view's gradient into the base's. A step run from the graph alone
handed the view over without a gradient path: a loss on `y.t()` lost its gradient
(parameter gradients 500x off eager's, silently), and was then refused once a loss
read it, which refused CLIP's usual symmetric contrastive loss.

So the runtime takes such a view again, under autograd, on the base output it hands
over (`take_again`), by replaying the graph's own view ops from the base to the view
(`chains`): each has eager's backward, so the view's gradient reaches the base laid out
as eager's does (an `as_strided` of the same geometry handed the base a gradient of the
base's strides where eager's `slice` backward makes a contiguous one, and a bias summed
over it came out 8e-8 off: found by the property test in `tests/test_trust.py`).
Views of one tensor the forward does not return (`return y[:, :4], y[:, 4:]`; AltCLIP's
`last_hidden_state` and `pooler_output`) are taken again on that tensor, which the
graph returns as a hidden user output (the last ones, `torch.hidden_outputs`) that the
runtime does not hand over, as AOTAutograd's wrapper does.

Where autograd would add the base gradient's parts in another order than eager's
(`_in_eagers_order`): a view of a tensor the model also reads after taking the view
(`y.t()`, then `y.sin()`): the tensor's gradient then has parts from the loss, from the
view and from inside the graph, which the graph adds after autograd has added the first
two, where eager's engine adds the later reader's first (1e-7 off; `return y, y.t(),
y.sin()` was taken again and trained so, silently, until 2026-12-04); and a view whose
own result the forward reads otherwise (`return h, h[:, 0], h.mean(1)`, h a Linear's 3-d
result: a view of its 2-d one). Views of a tensor the model returns are then not taken
again, and refused once a loss reads one (`runtimes/torch.py: _Outputs.backward`): the
base's gradient may come from the loss itself. Views of a hidden base are taken again,
and a backward is refused only where it gets gradients both through them and through
the outputs the other readers reach (`Views.unordered`): a loss reading only the views
(the last hidden state), or only the other readers' results, trains as eager, the graph
adding nothing to what autograd handed it, or autograd handing nothing (hunt59 found
that loss refused). Not taken again either, so refused once a loss reads it: a view the
graph reaches otherwise than by view ops of one tensor each from the base. A reader
made before the views adds its part after theirs in eager too: taken again
unconditionally.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from remat_ir.ir import Graph, pb
from remat_ir.ir.arguments import decode
from remat_ir.ir.gradient_edges import passes_gradient
from remat_ir.ir.memory import is_view
from remat_ir.torchlib.types import resolve_op, to_torch_argument


@dataclass(frozen=True)
class Views:
    """The views of other outputs that the runtime takes again (`chains`): the view ops
    to replay, in the forward's order, each once."""
    ops: list[pb.Node]                 # graph order: eager's order of making them
    bases: dict[int, int]              # base value: its output position
    views: dict[int, int]              # view output position: its value
    #: Per base output position whose views autograd would not add in eager's order: (the
    #: positions whose gradients autograd adds, the base's and its views'; the positions
    #: the forward's other readers reach, whose parts the graph adds). Gradients for both
    #: in one backward are refused (`_in_eagers_order`).
    unordered: dict[int, tuple[frozenset[int], frozenset[int]]]


def chains(graph: Graph, user_outputs: list[int], bases: dict[int, int],
           unconditional: frozenset[int] = frozenset(), hidden: int = 0) -> Views:
    """The views (`bases`: output position -> its base's, from the frontend's
    `torch.output_view_bases`) that can be taken again, with the view ops that make them
    from their bases: all views of a base, or none. Where autograd would add the base
    gradient's parts in another order than eager's (`_in_eagers_order`), they are taken
    again on the condition `Views.unordered` states where their base is one of the last
    `hidden` outputs (AOTAutograd's, not handed over: a gradient for it comes through the
    views alone), unless one of the outputs concerned is among `unconditional` (outputs
    whose gradients the outputs' node may not see). Else they are not taken again, and
    refused once a loss reads them: a returned base's gradient may come from the loss
    alone (`return y, y.t(), y.sin()` with a loss on `y + y.sin()`, refused so; hunt62)."""
    by_base: dict[int, dict[int, list[pb.Node]]] = {}
    for i, b in bases.items():
        chain = _chain(graph, user_outputs[b], user_outputs[i])
        if chain is not None:
            by_base.setdefault(b, {})[i] = chain
    order = {node.id: k for k, node in enumerate(graph.proto.nodes)}
    ops: dict[int, pb.Node] = {}
    taken: dict[int, int] = {}
    unordered: dict[int, tuple[frozenset[int], frozenset[int]]] = {}
    for b, views in by_base.items():
        replayed = {node.id: node for chain in views.values() for node in chain}
        if not _in_eagers_order(graph, user_outputs[b], replayed, order):
            reached = _reached(graph, _other_readers(graph, user_outputs[b], replayed), user_outputs)
            outside = frozenset([b, *views])
            if (reached | outside) & unconditional or b < len(user_outputs) - hidden:
                continue   # a gradient of theirs may start the backward elsewhere, or be the loss's
            unordered[b] = (outside, reached)
        ops.update(replayed)
        taken.update((i, b) for i in views)
    return Views(sorted(ops.values(), key=lambda node: order[node.id]),
                 {user_outputs[b]: b for b in taken.values()},
                 {i: user_outputs[i] for i in taken}, unordered)


def _in_eagers_order(graph: Graph, base: int, replayed: dict[int, pb.Node], order: dict[int, int]) -> bool:
    """Whether autograd, adding the parts of `base`'s gradient that come through the
    `replayed` view ops (taken again on the output handed over), and then the graph,
    adding the parts of the forward's other readers of `base` to what autograd handed
    it, add them in eager's order.

    Eager's engine runs the loss's backward nodes first, then the forward's, those made
    last first among the ready ones: a view made after every other reader of `base`
    hands its part over before theirs, as autograd does before the graph runs. So: every
    other reader of `base` comes before the views in the forward (a head reads `h`, then
    `h[:, 0]` is returned), and the views' own results are read by nothing else (`a =
    y.t(); return a, a.sin()` sums `a`'s parts in a buffer of its own). `return y, y.t(),
    y.sin()`, its `sin` made after the view, was taken again and trained 1e-7 off eager's,
    silently, until 2026-12-04. A reader passing no gradient back (`detach`, `argmax`)
    adds no part."""
    def readers(value: int) -> list[pb.Node]:
        return [node for node in map(graph.node, graph.users(value)) if node.phase == pb.FORWARD]
    if any(reader.id not in replayed and passes_gradient(graph, reader)
           for node in replayed.values() for v in node.outputs for reader in readers(v)):
        return False
    first = min((order[n] for n in replayed), default=None)   # none: the base returned twice
    return first is None or all(order[reader.id] < first for reader in readers(base)
                                if reader.id not in replayed and passes_gradient(graph, reader))


def _other_readers(graph: Graph, base: int, replayed: dict[int, pb.Node]) -> list[pb.Node]:
    """The forward's readers of `base` and of the `replayed` views' results that are not
    replayed and pass a gradient back: the parts the graph adds to the base's gradient."""
    values = [base, *(v for node in replayed.values() for v in node.outputs)]
    return [node for value in values for node in map(graph.node, graph.users(value))
            if node.phase == pb.FORWARD and node.id not in replayed and passes_gradient(graph, node)]


def _reached(graph: Graph, readers: list[pb.Node], user_outputs: list[int]) -> frozenset[int]:
    """The positions of the user outputs that forward values lead to from `readers`."""
    position = {value: i for i, value in enumerate(user_outputs)}
    found, seen = set(), {node.id for node in readers}
    todo = list(readers)
    while todo:
        node = todo.pop()
        for value in node.outputs:
            if value in position:
                found.add(position[value])
            for n in graph.users(value):
                user = graph.node(n)
                if user.phase == pb.FORWARD and user.id not in seen:
                    seen.add(user.id)
                    todo.append(user)
    return frozenset(found)


def _chain(graph: Graph, base: int, value: int) -> list[pb.Node] | None:
    """The view ops (one tensor in, one out) that make `value` from `base`, first first;
    None where another op is on the way."""
    found = []
    while value != base:
        producer = graph.producer(value)
        node = graph.node(producer) if producer is not None else None
        if (node is None or node.phase != pb.FORWARD or not is_view(graph, node)
                or len(node.inputs) != 1 or list(node.outputs) != [value] or len(node.output_indices)):
            return None
        found.append(node)
        value = node.inputs[0]
    return found[::-1]


def take_again(outputs: tuple, found: Views, device: torch.device) -> tuple:
    """`outputs` with each view of `found` taken again on its base as handed over (a base
    that takes no gradient leaves its views as they are). Each view op runs once, in the
    forward's order, as eager ran them: views of views share their intermediate views
    (`a = y.t(); return a, a[2:]`), and autograd then adds the parts of a base's gradient
    in eager's order (a view made again per output, or the views made in output order,
    trained 1e-7 off eager where three views overlap)."""
    if not found.views:
        return outputs
    made = {v: outputs[b] for v, b in found.bases.items()
            if isinstance(outputs[b], torch.Tensor) and outputs[b].requires_grad}
    for node in found.ops:
        if node.inputs[0] not in made:
            continue

        def argument(a, base=made[node.inputs[0]]):
            return to_torch_argument(decode(a), lambda ref: base, device)
        made[node.outputs[0]] = resolve_op(node.op)(*(argument(a) for a in node.args),
                                                    **{k.name: argument(k.value) for k in node.kwargs})
    return tuple(made.get(found.views.get(i), o) for i, o in enumerate(outputs))
