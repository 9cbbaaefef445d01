"""An in-place op keeps the layout of the tensor it writes, as eager's does.

Why: AOTAutograd functionalizes `y.op_(...)` as `y2 = op(y, ...)` and reads `y2` wherever
`y` is read after it (through the view's inverse where `y` views another tensor). Eager
writes into `y`, which keeps its strides; the functional op lays out its result as its
kernel does, and several kernels do not follow their input: `masked_fill`,
`masked_scatter`, `scatter`, `index_add` and `index_copy` clone into a contiguous tensor
first. `z.t().masked_fill_(mask.t(), 0.25)` then left the traced `z` transposed
(column-major) where eager's stays row-major, and every later reduction or matmul over it
summed in another order: gradients 3.8e-6 off eager's, under every schedule, the loss
equal (found by a review, stop 110; the other ops by this module's test).

Two steps. `mark_written_layouts`, on the module `torch.export` made, has each in-place
op (in the regions export keeps as submodules too: a write under `no_grad` or inside an
autocast block) called through a wrapper that says, while it runs, which functional op
stands for it. While AOTAutograd traces, `written_layouts_traced` answers that functional
op, called on a dense tensor, with a fake result of that tensor's layout: autograd's
formulas then decide from eager's layout (`addmm`'s backward computes a transposed
product for a column-major input), and every later read is traced on it. Each such
answer is remembered by its op, shape and strides. `keep_written_layouts`, on the joint
graph, gives each node so answered its kernel's layout back and copies its result into
the layout tracing gave it (`new_empty_strided` and the functional `copy`, as
AOTAutograd writes eager's own copies into a layout), which every later read takes: the
same elements, laid out and read in eager's order (the copy is one more tensor of the
written size while it is made: a 6-layer MLP writing so in every layer saw its smallest
feasible budget rise 19%). Only a written tensor that is dense (a
transpose, a permutation, a tensor of its own) is so laid out: a view with gaps (a
strided slice) is written back through a scatter into its base, which keeps the base's
layout already. (Tagging the nodes' metadata instead missed the writes inside regions,
whose nodes AOTAutograd runs under the region's metadata: 2.3e-5 off under `no_grad`,
found by a review.)

Why not rewrite the in-place op as `y.copy_(op(y, ...))` before AOTAutograd: then `y`
before the write is read twice, and the zero gradient `copy_` gives it is added to the
op's, which turns a gradient of -0.0 into +0.0; and an op that saves `y` for its
backward fails autograd's check of a tensor changed after it was saved.
"""

from __future__ import annotations

import contextlib
import threading

import torch
import torch.fx
from torch._prims_common import is_non_overlapping_and_dense_or_false

from remat_ir.torchlib.types import same_layout

from .fake_dispatch import wrapped_fake_dispatch
from .fx_nodes import add_call, tensor_value, traced_values

_aten = torch.ops.aten
#: While an in-place op wrapped by `mark_written_layouts` runs: `functional`, the op that
#: functionalization calls for it; while `written_layouts_traced` is entered: `answered`,
#: (op, shape, strides) of each result answered in a written tensor's layout.
_writing = threading.local()


def _functional(op) -> torch._ops.OpOverload | None:
    """The out-of-place overload of the in-place aten op `op` (`masked_fill_.Scalar` ->
    `masked_fill.Scalar`), or None where `op` is no such op or has none. Random ops are
    left out: their draws follow the layout they write into (`inplace_draws`)."""
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return None
    name, arguments = op._opname, op._schema.arguments
    if (not name.endswith("_") or name.startswith("_") or not arguments or arguments[0].alias_info is None
            or not arguments[0].alias_info.is_write or torch.Tag.nondeterministic_seeded in op.tags):
        return None
    packet = getattr(_aten, name[:-1], None)
    functional = getattr(packet, op._overloadname, None) if packet is not None else None
    # Not an op changing only shape and strides (`t_`, `as_strided_`, `transpose_`), whose
    # functional op is a view: answered in the written tensor's layout, its new strides
    # were lost (3e-5 off; a square buffer's `t_()` 1.2e3 off; found by a review).
    if (functional is None or functional._schema.is_mutable
            or any(r.alias_info is not None for r in functional._schema.returns)):
        return None
    return functional


def _dense_layout(tensor) -> bool:
    return tensor.layout == torch.strided and is_non_overlapping_and_dense_or_false(tensor)


def _writing_through(op: torch._ops.OpOverload, functional: torch._ops.OpOverload):
    """`op`, called with `_writing.functional` set to `functional` while it runs."""
    def call(*args, **kwargs):
        before = getattr(_writing, "functional", None)
        _writing.functional = functional
        try:
            return op(*args, **kwargs)
        finally:
            _writing.functional = before
    call.__name__ = call.__qualname__ = f"{op._opname}_keeping_layout"
    return call


def mark_written_layouts(module: torch.fx.GraphModule) -> int:
    """Wrap each in-place op of `module` (from `torch.export`; regions it keeps as
    submodules too) whose written tensor is dense (module docstring); the number wrapped."""
    count = 0
    for graph_module in [m for m in module.modules() if isinstance(m, torch.fx.GraphModule)]:
        wrapped = 0
        for node in graph_module.graph.nodes:
            functional = _functional(node.target) if node.op == "call_function" else None
            written = tensor_value(node.args[0]) if functional is not None and node.args else None
            if written is None or not _dense_layout(written):
                continue
            node.target = _writing_through(node.target, functional)
            wrapped += 1
        if wrapped:
            graph_module.recompile()
        count += wrapped
    return count


@contextlib.contextmanager
def written_layouts_traced():
    """Within (around AOTAutograd's tracing and `keep_written_layouts`): the functional op
    standing for a wrapped in-place op, called on a dense tensor, answers a fake result
    laid out as that tensor (module docstring)."""
    from torch._subclasses.fake_tensor import FakeTensor

    def wrap(original):
        def dispatch(mode, func, types, args=(), kwargs=None):
            result = original(mode, func, types, args, kwargs)
            if (getattr(_writing, "functional", None) is not func or not args
                    or not isinstance(result, torch.Tensor) or not isinstance(args[0], torch.Tensor)):
                return result
            written = args[0]
            if (written.shape != result.shape or written.dtype != result.dtype or not _dense_layout(written)
                    or same_layout(result, written.shape, written.stride())):
                return result
            _writing.answered.add((func, tuple(result.shape), written.stride()))
            meta = torch.empty_strided(result.shape, written.stride(), dtype=result.dtype, device="meta")
            return FakeTensor(mode, meta, result.device)
        return dispatch

    before = getattr(_writing, "answered", None)
    _writing.answered = set()
    try:
        with wrapped_fake_dispatch(wrap):
            yield
    finally:
        _writing.answered = before


def keep_written_layouts(module: torch.fx.GraphModule) -> int:
    """Give each node of the joint graph `module` that `written_layouts_traced` answered in
    a written tensor's layout its kernel's layout, and copy its result into the layout
    tracing gave it (module docstring), in place; the number of copies made. Call it
    within `written_layouts_traced` and under `traced_as_run`, so that the fake kernel
    gives the kernel's layout."""
    graph, count, answered = module.graph, 0, _writing.answered
    for node in list(graph.nodes):
        traced = tensor_value(node)
        if (node.op != "call_function" or traced is None
                or (node.target, tuple(traced.shape), traced.stride()) not in answered):
            continue
        with traced.fake_mode:
            made = node.target(*traced_values(node.args), **traced_values(node.kwargs))
        if not isinstance(made, torch.Tensor) or same_layout(made, traced.shape, traced.stride()):
            continue
        node.meta["val"] = made
        with graph.inserting_after(node), traced.fake_mode:
            empty = add_call(graph, node.meta, _aten.new_empty_strided.default,
                             (node, list(traced.shape), list(traced.stride())))
            with graph.inserting_after(empty):
                laid = add_call(graph, node.meta, _aten.copy.default, (empty, node))
        node.replace_all_uses_with(laid, delete_user_cb=lambda user: user not in (empty, laid))
        count += 1
    if count:
        graph.lint()
        module.recompile()
    return count
