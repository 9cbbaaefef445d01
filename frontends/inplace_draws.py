"""In-place random fills of tensors that are not contiguous draw in eager's layout.

Eager's `v.bernoulli_(p)`, `v.normal_()`, ... and the noise of `F.dropout(v,
inplace=True)` are drawn into `v`'s own layout (the noise: `empty_like(v)`); the
functional forms tracing turns them into draw into a fresh contiguous tensor. Where
`v` is not contiguous (a transpose, a column slice) the kernels pair draws with other
elements, or take another path (`normal_`'s serial Box-Muller), so the step trained
with other masks and noise than eager, under every schedule, without a word (2026-11-29
sweep: `h.t().bernoulli_(0.5)`, `h[:, :8].normal_()`, `F.dropout(h.t(), inplace=True)`;
outputs 1.2-1.6 off, the generator left elsewhere after `normal_`).

`draw_in_layout`, on the module `torch.export` made (which still holds the in-place
ops) before AOTAutograd functionalizes it, replaces each such fill by
`v.copy_(remat_ir::draw_in_layout(v, v.stride(), method, args))`
(`torchlib/layout_draws.py`: the same kernel on a tensor of the same strides), and a
CPU training `dropout_` of a non-contiguous `v` whose noise `empty_like` keeps that
layout by eager's own steps over such a draw: `v.mul_(draw / (1 - p))`. A fill of a
contiguous tensor is left as it is: its functional form draws the same numbers.

Refused, with the line: `bernoulli_` with a tensor of probabilities and alpha dropout
in place, on such a view (eager pairs their draws with their other operand's layout,
which the op does not reproduce).
"""

from __future__ import annotations

import torch
import torch.fx

from remat_ir.torchlib import layout_draws  # noqa: F401  registers the op

from .errors import LoweringError
from .fx_nodes import add_call, recompiled, replace, tensor_value
from .model_lines import node_line

_aten = torch.ops.aten
_DRAW = torch.ops.remat_ir.draw_in_layout.default

#: In-place fills: op -> Tensor method `draw_in_layout` runs.
_FILLS = {
    _aten.bernoulli_.float: "bernoulli_",
    _aten.normal_.default: "normal_",
    _aten.uniform_.default: "uniform_",
    _aten.exponential_.default: "exponential_",
    _aten.cauchy_.default: "cauchy_",
    _aten.log_normal_.default: "log_normal_",
    _aten.geometric_.default: "geometric_",
    _aten.random_.default: "random_",
    _aten.random_.to: "random_",
    getattr(_aten.random_, "from"): "random_",
}

#: In-place ops whose draws pair with a layout the rewrite does not reproduce.
_REFUSED = (_aten.bernoulli_.Tensor,)

#: Ops whose noise is `empty_like(input)` filled in place (eager's `_dropout_impl`): in a
#: dense input's own layout.
_NOISE_LIKE_INPUT = (_aten.alpha_dropout.default, _aten.alpha_dropout_.default)


def _arguments(node: torch.fx.Node) -> list:
    """The op's arguments after `self`, defaults filled in, less the generator."""
    schema = node.target._schema.arguments
    values = []
    for i, argument in enumerate(schema[1:], start=1):
        if argument.name == "generator":
            continue
        if i < len(node.args):
            values.append(node.args[i])
        elif argument.name in node.kwargs:
            values.append(node.kwargs[argument.name])
        else:
            values.append(argument.default_value)
    return values


def _noise_keeps_layout(fake: torch.Tensor) -> bool:
    """Whether `empty_like(fake)` (eager dropout's noise) has `fake`'s strides: a dense,
    non-overlapping tensor keeps them, others get contiguous ones."""
    return torch.empty_like(fake).stride() == fake.stride()


def _memory_order(fake: torch.Tensor) -> list[int] | None:
    """The permutation of `fake`'s dimensions that makes it contiguous (outermost first),
    where there is one (a dense, non-overlapping tensor: a transpose, channels-last);
    None for others (a slice's gaps), whose `empty_like` is contiguous anyway."""
    order = sorted(range(fake.dim()), key=lambda d: (-fake.stride(d), d))
    return order if fake.permute(order).is_contiguous() else None


def draw_in_layout(module: torch.fx.GraphModule, model: str) -> int:
    """Rewrite `module` (from `torch.export`, in place) as the docstring says; the number
    of fills rewritten."""
    graph, count = module.graph, 0
    for node in list(graph.nodes):
        if node.op != "call_function" or not node.args:
            continue
        fake = tensor_value(node.args[0])
        if fake is None or fake.is_contiguous():
            continue
        if node.target in _REFUSED:
            raise LoweringError(
                f"{model} calls {node.target} on a tensor that is not contiguous ({node_line(node) or 'in its forward'}): "
                f"eager pairs its draws with that layout, which remat-ir does not reproduce. "
                f"Call it on a contiguous tensor (`.contiguous()`), or out of place")
        with graph.inserting_before(node), fake.fake_mode:
            if node.target in _FILLS:
                method, arguments = _FILLS[node.target], _arguments(node)
                if any(a is None for a in arguments):   # random_(from, None): to the dtype's end
                    raise LoweringError(
                        f"{model} calls {node.target} with no upper end on a tensor that is "
                        f"not contiguous ({node_line(node) or 'in its forward'}), which remat-ir cannot draw in "
                        f"eager's layout: give the upper end, or call it on a contiguous tensor")
                arguments = [float(a) for a in arguments]
                draw = add_call(graph, node.meta, _DRAW,
                                (node.args[0], list(fake.stride()), method, arguments))
                new = add_call(graph, node.meta, _aten.copy_.default, (node.args[0], draw))
            elif (node.target is _aten.dropout_.default and fake.device.type == "cpu"
                  and _noise_keeps_layout(fake)):
                p, train = _arguments(node)
                if not train or not 0 < p < 1:
                    continue
                draw = add_call(graph, node.meta, _DRAW,
                                (node.args[0], list(fake.stride()), "bernoulli_", [1 - p]))
                noise = add_call(graph, node.meta, _aten.div.Scalar, (draw, 1 - p))
                new = add_call(graph, node.meta, _aten.mul_.Tensor, (node.args[0], noise))
            elif node.target in _NOISE_LIKE_INPUT and (order := _memory_order(fake)) is not None:
                # Eager's noise is in the input's memory order: the op on the input seen in
                # that order (a contiguous view) draws the same noise for each element.
                inverse = sorted(range(len(order)), key=order.__getitem__)
                seen = add_call(graph, node.meta, _aten.permute.default, (node.args[0], order))
                done = add_call(graph, node.meta, node.target, (seen, *node.args[1:]), node.kwargs)
                new = add_call(graph, node.meta, _aten.permute.default, (done, inverse))
            elif node.target is _aten.rrelu.default and _arguments(node)[2]:   # training
                # Eager's rrelu returns a contiguous result (its noise too, drawn in logical
                # order) where the traced one keeps the input's layout: later products
                # summed in another order (1e-7 off).
                dense = add_call(graph, node.meta, _aten.contiguous.default, (node.args[0],))
                new = add_call(graph, node.meta, node.target, (dense, *node.args[1:]), node.kwargs)
            else:
                continue
        replace(node, new)
        count += 1
    return recompiled(module, count)
