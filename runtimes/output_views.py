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

Not taken again, so refused once a loss reads the view (`runtimes/torch.py:
_Outputs.backward`): a view of an output the model also reads itself (`y.sin()`
inside): the output's gradient then has parts from the loss, from the view and from
inside the graph, which the graph adds after autograd has added the first two, another
order than eager's engine (1e-7 off); and a view the graph reaches otherwise than by
view ops of one tensor each from the base.
"""

from __future__ import annotations

import torch

from remat_ir.ir import Graph, pb
from remat_ir.ir.arguments import decode
from remat_ir.ir.memory import is_view
from remat_ir.torchlib.types import resolve_op, to_torch_argument

#: Per view output's position: (its base output's position, the view ops from the base).
Chains = dict[int, tuple[int, list[pb.Node]]]


def chains(graph: Graph, user_outputs: list[int], bases: dict[int, int]) -> Chains:
    """The views (`bases`: output position -> its base's, from the frontend's
    `torch.output_view_bases`) that can be taken again, with the view ops that make each
    from its base."""
    found = {}
    for i, b in bases.items():
        if _only_viewed(graph, user_outputs[b], set(user_outputs)):
            chain = _chain(graph, user_outputs[b], user_outputs[i])
            if chain is not None:
                found[i] = (b, chain)
    return found


def _only_viewed(graph: Graph, value: int, returned: set[int]) -> bool:
    """Whether the forward reads `value` only to return views of it (through views of
    views: `y.t()[1:3]`)."""
    readers = [graph.node(n) for n in graph.users(value)]
    return all(v in returned or (is_view(graph, node) and _only_viewed(graph, v, returned))
               for node in readers if node.phase == pb.FORWARD for v in node.outputs)


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


def take_again(outputs: tuple, found: Chains, device: torch.device) -> tuple:
    """`outputs` with each view of `found` taken again on its base as handed over (a base
    that takes no gradient leaves the view as it is)."""
    if not found:
        return outputs
    outputs = list(outputs)
    for i, (b, chain) in found.items():
        view = outputs[b]
        if not (isinstance(view, torch.Tensor) and view.requires_grad):
            continue
        for node in chain:
            def argument(a, view=view):
                return to_torch_argument(decode(a), lambda ref: view, device)
            view = resolve_op(node.op)(*(argument(a) for a in node.args),
                                       **{k.name: argument(k.value) for k in node.kwargs})
        outputs[i] = view
    return tuple(outputs)
