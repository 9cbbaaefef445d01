"""`x[mask] = values` becomes `remat_ir::put_masked`, an op of fixed shapes.

Eager's backward of a boolean-mask assignment gives the values the sum of
`grad[mask]`, a tensor with as many rows as the mask has set elements: traced, the
joint graph had no fixed shape there, and the model was refused ("calls aten.nonzero
... whose result's shape depends on tensor data"). A masked autoencoder's
`tokens[mask] = self.mask_token` and wav2vec2's SpecAugment in pretraining
(`hidden_states[mask_time_indices] = self.masked_spec_embed`) do this.
`torchlib/masked_assign.py` gives the assignment as one op of fixed shapes that runs
eager's kernels forward and backward.

`assign_through_masks`, on the module `torch.export` made (which still holds the
in-place `index_put_`) before AOTAutograd functionalizes it, replaces each
`index_put_(x, [None, ..., mask], values)` with one boolean mask, and the functional
`torch.index_put(x, (mask,), values)` (refused before, found by an op sweep), which makes
a new tensor as the op does. Where `x` is a fresh
tensor (no view of another) read by nothing but the assignment, what read the
assignment's result reads the op's; elsewhere (a view, whose base the write must reach)
the values are written into `x` in place by ops whose backward copies the gradient as
eager's does (`_assign_in_place`). Assignments of
values needing no gradient (`x[mask] = 0`, `logits[mask] = -inf`), whose traced backward
had fixed shapes, become the op too (the trace does not tell which values need one): it
runs the same kernels.
"""

from __future__ import annotations

import torch
import torch.fx

from remat_ir.torchlib import masked_assign  # noqa: F401  registers the op

from .fx_nodes import add_call, recompiled, replace, tensor_value

_aten = torch.ops.aten
_PUT = torch.ops.remat_ir.put_masked.default


def _mask_form(node: torch.fx.Node) -> tuple[int, torch.fx.Node] | None:
    """(leading full dimensions, mask) where `node` assigns values through one boolean
    mask, else None. Whether the values need a gradient is not asked: export's fake
    values of tensors the forward computes say they need none."""
    if node.target not in (_aten.index_put_.default, _aten.index_put.default):
        return None
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    indices, values = node.args[1], tensor_value(node.args[2])
    if accumulate or values is None or not indices:
        return None
    *leading, mask = indices
    fake = tensor_value(mask)
    if any(index is not None for index in leading) or fake is None or fake.dtype != torch.bool:
        return None
    return len(leading), mask


def _fresh(node) -> bool:
    """Whether `node` makes a tensor of its own (no view of another, no input), read by
    nothing but the one assignment after it."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or len(node.users) != 1:
        return False
    if node.target is _PUT:
        return True
    if not isinstance(node.target, torch._ops.OpOverload):
        return False
    return all(r.alias_info is None for r in node.target._schema.returns)


#: Dtypes whose zeros carry a sign and whose CPU kernels take `masked_fill_` and `add_`
#: (float8 has no CPU `masked_fill`): others keep the copy of `_assign_in_place`.
_SIGNED = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
           torch.complex128)


def _assign_in_place(graph: torch.fx.Graph, meta: dict, target: torch.fx.Node,
                     mask: torch.fx.Node, leading: int, values: torch.fx.Node) -> torch.fx.Node:
    """`target[..., mask] = values` written into `target` (a view, or a tensor read
    elsewhere too), with eager's bits forward and backward.

    Why not `target.copy_(put_masked(target, ...))`: `target`'s old value then reaches
    the gradient twice, through the op and, as zeros, through the copy, and the engine
    adds the two: a gradient of -0.0 came out +0.0 (eager's `index_put_` backward copies,
    never adds). Here `target`'s old value is read only by in-place ops whose backward
    autograd applies by copying: `masked_fill_(mask, -0.0)`, then `add_` of the values
    put into a tensor of -0.0 elsewhere. -0.0 + x is x for every x, -0.0 and NaN
    included, so the forward writes eager's bits, and the backward gives `target` eager's
    `grad` with zeros at the mask and the values eager's `grad[mask]` summed to their
    shape (`put_masked`'s backward). A complex tensor is written through its real view
    (each part's zero has its sign; complex addition gives (-0-0j) + (-0-0j) a real part
    of +0.0). Integers and bools, whose zeros have no sign, and float8 keep the copy.
    Not eager's bits with `torch.set_flush_denormal(True)`: the add then flushes
    subnormals that eager's write leaves."""
    fake = tensor_value(target)
    if fake.dtype not in _SIGNED:
        put = add_call(graph, meta, _PUT, (target, mask, leading, values))
        return add_call(graph, meta, _aten.copy_.default, (target, put))
    wide = mask
    if tensor_value(mask).device != fake.device:   # eager indexes with a CPU mask on any device
        wide = add_call(graph, meta, _aten._to_copy.default, (wide,), {"device": fake.device})
    zero = complex(-0.0, -0.0) if fake.is_complex() else -0.0
    background = add_call(graph, meta, _aten.full_like.default, (target, zero))
    put = add_call(graph, meta, _PUT, (background, mask, leading, values))
    written = target
    if fake.is_complex():
        written = add_call(graph, meta, _aten.view_as_real.default, (target,))
        put = add_call(graph, meta, _aten.view_as_real.default, (put,))
    for _ in range(tensor_value(written).dim() - leading - tensor_value(mask).dim()):
        wide = add_call(graph, meta, _aten.unsqueeze.default, (wide, -1))
    cleared = add_call(graph, meta, _aten.masked_fill_.Scalar, (written, wide, -0.0))
    done = add_call(graph, meta, _aten.add_.Tensor, (cleared, put))
    return done if written is target else target   # the complex tensor, its parts written


def assign_through_masks(module: torch.fx.GraphModule) -> int:
    """Rewrite `module` (from `torch.export`, in place) as the docstring says; the number
    of assignments rewritten."""
    graph, count = module.graph, 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        form = _mask_form(node)
        if form is None:
            continue
        leading, mask = form
        target, values = node.args[0], node.args[2]
        with graph.inserting_before(node), tensor_value(target).fake_mode:
            if _fresh(target) or node.target is _aten.index_put.default:   # functional: a new tensor
                new = add_call(graph, node.meta, _PUT, (target, mask, leading, values))
            else:
                new = _assign_in_place(graph, node.meta, target, mask, leading, values)
        replace(node, new)
        count += 1
    return recompiled(module, count)
