"""Writes through `Tensor.unfold` windows keep eager's values and layout.

Why: AOTAutograd functionalizes an in-place op on a view by computing the view's base
again from the written view, through the view's inverse. For an `unfold` view that
inverse is `unfold_backward`, which makes a new zero tensor and adds each window into
it. Elements no window covers (a step larger than the size, or a tail after the last
window) come out zero where eager keeps them, and the result is contiguous where eager's
base keeps its own layout. `y.unfold(1, 2, 3).mul_(2.0)` returned values off by 1.0, and
their gradients were lost (torch.compile's `aot_eager` backend computes the same);
`y.t().unfold(0, 2, 2).mul_(2.0)`, every element covered, returned `y.t()` transposed
where eager's is contiguous, and the loss and the bias gradient summed it in another
order (gradients 1e-7 off).

`write_through_unfold_views` rewrites each unfold that something writes through (the
window view itself, or a view of it, also inside a `no_grad` block: `fx_nodes.first_write`),
in the module `torch.export` made, before AOTAutograd functionalizes it, as views whose inverses keep their base: a `narrow` to
the windows' span, a `view` splitting it into (windows, step), a `narrow` of each to the
size, and the window dimension moved last. They view the same elements with the same
strides as the unfold, so every read gets eager's bits, and a write reaches the base
through `slice_scatter`, which copies the base (its values and layout) and writes the
windows in. Where the span is not a whole number of steps (a step larger than the size
and a tail after the last window shorter than a step), a tensor that is its own base gets
an `as_strided` view of the same strides instead; a view of another tensor cannot
(AOTAutograd refuses a write through `as_strided` of a view) and is refused with what to
do. Overlapping windows (size above step) are left to AOTAutograd, which refuses a write
through them; `unwritable_view_error` says that refusal by the model's line.
"""

from __future__ import annotations

import torch
import torch.fx

from .errors import LoweringError
from .fx_nodes import add_call, first_write, recompiled, replace, tensor_value, views_first_argument
from .model_lines import node_line

_aten = torch.ops.aten


def _windows(unfold: torch.fx.Node, base: torch.Tensor, dim: int, size: int, step: int,
             span: int) -> torch.fx.Node:
    """The unfold's windows as narrow, view, narrow and permute of `unfold`'s input."""
    graph, meta, source = unfold.graph, unfold.meta, unfold.args[0]
    shape = list(base.shape)
    count = span // step
    part = add_call(graph, meta, _aten.slice.Tensor, (source, dim, 0, span))
    split = add_call(graph, meta, _aten.view.default,
                     (part, shape[:dim] + [count, step] + shape[dim + 1:]))
    cut = add_call(graph, meta, _aten.slice.Tensor, (split, dim + 1, 0, size))
    order = [d for d in range(len(shape) + 1) if d != dim + 1] + [dim + 1]
    return add_call(graph, meta, _aten.permute.default, (cut, order))


def write_through_unfold_views(module: torch.fx.GraphModule, model_name: str) -> int:
    """Rewrite `module` (from `torch.export`, in place) as the docstring says; the number
    of unfolds rewritten. Raises LoweringError where a write cannot keep eager's values."""
    graph, count = module.graph, 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not _aten.unfold.default:
            continue
        base = tensor_value(node.args[0])
        writer = first_write(node, module)
        if base is None or writer is None:
            continue
        dim, size, step = node.args[1:4]
        dim = dim % max(1, base.dim())
        length = base.shape[dim] if base.dim() else 1
        if size > step or base.dim() == 0:
            continue   # overlapping windows: eager refuses the write itself
        windows = (length - size) // step + 1
        with graph.inserting_before(node), base.fake_mode:
            if windows * step <= length:
                new = _windows(node, base, dim, size, step, windows * step)
            elif not views_first_argument(node.args[0]):
                stride = base.stride()
                new = add_call(graph, node.meta, _aten.as_strided.default, (
                    node.args[0],
                    list(base.shape[:dim]) + [windows] + list(base.shape[dim + 1:]) + [size],
                    list(stride[:dim]) + [stride[dim] * step] + list(stride[dim + 1:]) + [stride[dim]],
                    base.storage_offset()))
            else:
                where = node_line(writer) or node_line(node)
                raise LoweringError(
                    f"{model_name}'s forward writes in place ({writer.target}"
                    f"{f' at {where}' if where else ''}) through Tensor.unfold({dim}, {size}, "
                    f"{step}) of a tensor that views another, whose windows leave elements out "
                    f"(dimension of {length}): the traced step would compute those elements as "
                    f"zeros (PyTorch's functionalization writes an unfold view back so; "
                    f"torch.compile does too). Unfold a tensor of its own (`.clone()` first, "
                    f"writing the result back where eager's write lands), or compute the windows "
                    f"out of place")
        replace(node, new)
        count += 1
    return recompiled(module, count)


def unwritable_view_error(model_name: str, message: str, exported: torch.fx.GraphModule) -> LoweringError | None:
    """The refusal for a write in place that AOTAutograd cannot functionalize, by the
    model's line (`exported`: the module torch.export made, as it made it), or None for
    another error (`message`: AOTAutograd's). Found by a review: both were said in
    torch.compile's words, naming no line, with advice about graph breaks.

    - Through overlapping `unfold` windows (`z.unfold(1, 2, 1).relu_()`): eager writes each
      element once per window that holds it, in the order its kernel picks, and runs it
      for the ops its overlap check lets through; the traced step cannot.
    - Through an `as_strided` view of a view of another tensor (`z.t().fill_diagonal_(v)`,
      which takes one, or the user's own `as_strided`): its write cannot be computed back
      into the base.
    """
    if "internal overlap" in message:
        found = [(node, first_write(node, exported)) for node in exported.graph.nodes
                 if node.target is _aten.unfold.default and node.args[2] > node.args[3]]
        where = next((node_line(writer) or node_line(node) for node, writer in found if writer is not None), None)
        return LoweringError(
            f"{model_name}'s forward writes in place through Tensor.unfold windows that overlap"
            f"{f' at {where}' if where else ''}: eager writes each element once per window "
            f"holding it, in an order its kernel picks, which the traced step cannot compute. "
            f"Write into the windows' copy (`.clone()`) and use it, or compute the result out of place")
    if "mutation on a view chain" in message and "as_strided" in message:
        writers = [node if node.target is _aten.fill_diagonal_.default else first_write(node, exported)
                   for node in exported.graph.nodes
                   if node.target in (_aten.fill_diagonal_.default, _aten.as_strided.default)]
        where = next((node_line(writer) for writer in writers if writer is not None and node_line(writer)), None)
        return LoweringError(
            f"{model_name}'s forward writes in place through an as_strided view of a view of "
            f"another tensor{f' at {where}' if where else ''} (`fill_diagonal_` takes one: "
            f"`z.t().fill_diagonal_(0.5)`), which cannot be written back into its base. Write "
            f"into a tensor of its own (`y = z.t().clone()`, then `y.fill_diagonal_(0.5)`) and read "
            f"that, or write through `diagonal()` (`z.t().diagonal().fill_(0.5)`)")
    return None
