"""In-place ops that change only a tensor's shape and strides become their views.

`y.t_()`, `y.squeeze_(1)`, `y.unsqueeze_(0)`, `y.transpose_(0, 1)` (and `swapdims_`,
`swapaxes_`) write no element: they give the tensor object another shape and strides.
AOTAutograd functionalizes such a change of a view of another tensor wrongly: a model
doing `y = h[:, None]; y.squeeze_(1); y.t_()` was refused with its internal message
("invalid gradient at index 0 - got [16, 8] but expected shape compatible with
[8, 1, 16]"), where eager trains it (found by a search, 2026-12-03).

`torch.export` traces every later read of the tensor through the in-place op's result,
as it does for writes, so that result can be the op's view instead, with the same shape
and strides: `reshape_in_place` puts the view there. The tensor object changed by the
call is the forward's own intermediate; a parameter, buffer or input (a placeholder),
which eager would leave changed for the caller, keeps the in-place op (and the refusal
tracing gives it).
"""

from __future__ import annotations

import torch
import torch.fx

from .fx_nodes import recompiled, replace

_aten = torch.ops.aten
_VIEW_OF = {
    _aten.t_.default: _aten.t.default,
    _aten.squeeze_.default: _aten.squeeze.default,
    _aten.squeeze_.dim: _aten.squeeze.dim,
    _aten.squeeze_.dims: _aten.squeeze.dims,
    _aten.unsqueeze_.default: _aten.unsqueeze.default,
    _aten.transpose_.default: _aten.transpose.int,
    _aten.swapdims_.default: _aten.transpose.int,
    _aten.swapaxes_.default: _aten.transpose.int,
}


def reshape_in_place(module: torch.fx.GraphModule) -> int:
    """Rewrite `module` (from `torch.export`, in place) as the docstring says; the number
    of ops rewritten."""
    graph, count = module.graph, 0
    for node in list(graph.nodes):
        view = _VIEW_OF.get(node.target) if node.op == "call_function" else None
        source = node.args[0] if view is not None and node.args else None
        if not isinstance(source, torch.fx.Node) or source.op == "placeholder":
            continue
        with graph.inserting_before(node):
            new = graph.call_function(view, (source, *node.args[1:]), dict(node.kwargs))
        # Tracing changed one fake tensor in place: its `val` is the tensor after the op,
        # as the view's is (AOTAutograd traces the module again from its inputs).
        new.meta.update(node.meta)
        replace(node, new)
        count += 1
    return recompiled(module, count)
