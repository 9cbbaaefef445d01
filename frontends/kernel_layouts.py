"""Where a kernel lays out its result otherwise than its meta kernel says, the graph is
laid out as the kernel runs, as eager runs it.

Tracing computes every value's strides with fake (meta) kernels, and the graph's views
are chosen for those strides: a `reshape` becomes a `view` where the traced layout allows
it. A few kernels lay out their result otherwise: batch norm over a non-contiguous
3-dimensional input (BatchNorm1d on a transposed (batch, length, channels) tensor, as
PatchTST does) returns a contiguous result on CPU where its fake kernel keeps the input's
strides. The `view` after the transpose back then failed at the first training step,
from inside the generated code ("view size is not compatible with input tensor's size
and stride"); eager's `reshape` had copied there. Copying the result back into the traced
layout ran, but not as eager: the GELU after it read a contiguous tensor where eager's
read a strided one, and ATen's vectorized and scalar GELU round differently (gradients
2e-7 off).

`match_kernel_layouts` runs once, at lowering, in graph order, each op whose result's
layout may follow its inputs' (a tensor that is not contiguous among its inputs or
results) on zero-filled inputs of the shapes and strides the graph gives them. Where a
result's strides or dtype differ (batch norm's saved statistics of a bfloat16 input are
float32 on CPU), the result takes the kernel's, and every op after it that reads a value
laid out anew computes its own layout again with its fake kernel (and is itself run
where its layout may follow). A `view` that the new layout does not allow becomes
eager's `reshape`: a contiguous `clone`, then the view; an `as_strided` of such a value,
whose strides are absolute, is refused. Random ops are not run (their draws would move
the generator), nor recurrent kernels or ops outside aten (`_UNRUN`); an op that fails
on zeros keeps its fake layout.

What tracing decides from a fake layout besides views (`linear` on a 3-d input becomes
`addmm` where the input is contiguous and `matmul` plus `add` otherwise; a dropout is
split into a mask drawn contiguous only over a contiguous input) is decided on the
kernels' layouts too: `traced_as_run` gives fake tensors each kernel's layout while
tracing. After PatchTST's batch norm the graph added the bias inside `addmm` where eager
adds it apart, which in bfloat16 rounds otherwise (gradients 1e-3 relative off from the
second step), and a dropout there drew other masks. `match_kernel_layouts` stays as the
check after tracing, and for the dtypes `traced_as_run` leaves as traced.
"""

from __future__ import annotations

import contextlib
import re

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils import _pytree as pytree

from remat_ir.ir.rng import contiguous_strides
from remat_ir.torchlib.types import same_layout

from .errors import LoweringError
from .fake_dispatch import wrapped_fake_dispatch
from .fx_nodes import add_call, node_module

_aten = torch.ops.aten
#: aten ops not run on zeros: recurrent kernels take workspaces and states of their own
#: (oneDNN's LSTM traced for inference crashed the process), the rest have no layout to
#: follow. Ops of other namespaces are not run either (a custom Function's op runs the
#: user's Python code).
_UNRUN = re.compile(r"mkldnn|rnn|lstm|gru|_local_scalar_dense|_assert|nonzero")
#: Views whose strides are given, not derived from their input's.
_ABSOLUTE = frozenset({_aten.as_strided.default, _aten.as_strided_copy.default})


@contextlib.contextmanager
def traced_as_run():
    """While tracing (torch.export, then AOTAutograd), each op `_runs` admits, with a
    tensor that is not contiguous among its inputs or results, gets the layout its kernel
    gives, run once on zeros per distinct signature: fake tensors
    then carry eager's strides, and what tracing decides from them is decided as eager
    decides it.

    Why not `match_kernel_layouts` alone: it corrects the joint graph afterwards, and
    rewrites before it decided from the fake layout. A dropout over BatchNorm1d's output
    transposed back (contiguous traced, strided on CPU) was split into a mask drawn
    contiguous where eager draws in the input's layout: other masks, 0.5 relative off in
    every gradient, under every schedule, with the generator's state alike. Likewise an
    in-place draw into the real layout (`inplace_draws`), a dropout after `torch.roll`
    of a channels-last tensor (channels-last on CPU, contiguous traced), and `linear`'s
    choice between `addmm` and `matmul` (the module docstring). Results of another dtype
    than traced (batch norm's statistics of a bfloat16 input) are left to
    `match_kernel_layouts`: a fake kernel after it may expect the traced one."""
    from torch._subclasses.fake_tensor import FakeTensor

    made: dict = {}   # signature -> the kernel's strides of each result, None where it fails

    def wrap(original):
        def dispatch(mode, func, types, args=(), kwargs=None):
            result = original(mode, func, types, args, kwargs)
            try:
                if _is_view(func):
                    return _viewed_as_run(original, mode, func, args, kwargs or {}, result, made)
                return _as_run(mode, func, args, kwargs or {}, result, made, FakeTensor)
            except Exception:   # a signature zeros cannot stand for: as traced
                return result
        return dispatch

    with wrapped_fake_dispatch(wrap):
        yield


def _as_run(mode, func, args, kwargs, result, made: dict, fake_class):
    """`result` with each tensor the kernel lays out otherwise re-made in its strides."""
    if not _runs(func) or not isinstance(result, (torch.Tensor, tuple, list)):
        return result   # a number or a flag (`is_pinned`) has no layout
    results = [result] if isinstance(result, torch.Tensor) else list(result)
    tensors = [a for a in pytree.tree_leaves((args, kwargs, results)) if isinstance(a, torch.Tensor)]
    if any(isinstance(d, torch.SymInt) for t in tensors for d in (*t.shape, *t.stride())):
        return result   # zeros need sizes; asking a symbolic tensor would add guards
    if not _strided(tensors):
        return result
    key = (func, _signature((args, kwargs)), _signature(results))
    if key not in made:
        made[key] = _kernel_layouts(func, args, kwargs)
    layouts = made[key]
    if layouts is None:
        return result
    redone = []
    for traced, made_as in zip(results, layouts):
        stride, dtype = made_as or (None, None)
        # Strides of dimensions of size 1 too: a view after takes its strides from them
        # (`_viewed_as_run`), and kernels choose from them (`conv2d` a channels-last
        # result for a batch of one with batch stride C*H*W, a contiguous one with C).
        if isinstance(traced, torch.Tensor) and dtype == traced.dtype and stride != traced.stride():
            meta = torch.empty_strided(traced.shape, stride, dtype=traced.dtype, device="meta")
            traced = fake_class(mode, meta, traced.device)
        redone.append(traced)
    return _rebuilt(result, redone)


def _rebuilt(result, redone: list):
    """`redone` in `result`'s form: a tensor, a tuple (or its named kind) or a list."""
    if isinstance(result, torch.Tensor):
        return redone[0]
    return type(result)(redone) if isinstance(result, tuple) else redone


def _is_view(func) -> bool:
    """An aten op whose results are views of an input, not written in place, with strides
    derived from its input's (not `as_strided`'s given ones)."""
    return (isinstance(func, torch._ops.OpOverload) and func.namespace == "aten"
            and func not in _ABSOLUTE and not func._schema.is_mutable
            and any(r.alias_info is not None for r in func._schema.returns))


def _viewed_as_run(original, mode, func, args, kwargs, result, made: dict):
    """`result`, views `func` made of fake tensors, each with the strides ATen's own view
    kernel gives it. The fake kernels of `view` and `_unsafe_view` derive strides of
    dimensions of size 1 otherwise than ATen: diffusers' attention turns (1, H*W, C) back
    into (1, C, H, W) with a batch stride of C where tracing said C*H*W. No element moves,
    but `conv2d` picks its result's memory format from those strides: contiguous in eager,
    channels-last traced, and a dropout after it drew its mask in the traced layout (0.66
    off in the outputs, gradients 4 off, for a batch of one only). ATen's kernel is run on
    meta tensors (no data), once per signature; the view is re-made with its strides over
    the same fake storage, so that it still aliases its input."""
    results = [result] if isinstance(result, torch.Tensor) else list(result) if isinstance(result, (tuple, list)) else []
    tensors = [a for a in pytree.tree_leaves((args, kwargs, results)) if isinstance(a, torch.Tensor)]
    if not results or any(isinstance(d, torch.SymInt) for t in tensors
                          for d in (*t.shape, *t.stride(), t.storage_offset())):
        return result
    key = (func, _signature((args, kwargs)))
    if key not in made:
        made[key] = _meta_strides(func, args, kwargs)
    strides = made[key]
    if strides is None or len(strides) != len(results):
        return result
    redone = []
    for traced, stride in zip(results, strides):
        if isinstance(traced, torch.Tensor) and stride is not None and stride != traced.stride():
            traced = original(mode, _aten.as_strided.default, (type(traced),),
                              (traced, traced.shape, stride, traced.storage_offset()), {})
        redone.append(traced)
    return _rebuilt(result, redone)


def _meta_strides(func, args, kwargs) -> list | None:
    """The strides of each result of `func` run on meta tensors laid out as `args`' fakes
    (None for a result that is no tensor), or None where the meta kernel fails. Not
    through the Python dispatcher tracing enables: its meta kernel of `view` is the fake
    one's, where ATen's C++ kernel is what eager runs."""
    reals = _run_on(func, args, kwargs, "meta")
    return None if reals is None else [r.stride() if isinstance(r, torch.Tensor) else None for r in reals]


def _runs(func) -> bool:
    """Whether `func` may be run on zeros to read its results' layouts: an aten op, not
    one of `_UNRUN`, not random, with results none of which is a view or written in
    place. It may write into an argument besides its results (export traces BatchNorm
    as `_native_batch_norm_legit`, which updates the running statistics: of zeros,
    here); `_audited` leaves those out of the functional joint graph."""
    if not isinstance(func, torch._ops.OpOverload) or func.namespace != "aten" or _UNRUN.search(func.__name__):
        return False
    returns = func._schema.returns
    return not (torch.Tag.nondeterministic_seeded in func.tags or not returns
                or any(r.alias_info is not None for r in returns))


def _strided(tensors) -> bool:
    """Whether a tensor of more than one element among `tensors` is not laid out as
    `torch.empty` lays out its shape: only then may a kernel lay its result out otherwise
    than its fake kernel says. Strides of dimensions of size 1 count: a (B, C, 1, 1) map
    pooled from a channels-last tensor is contiguous to `is_contiguous()`, but an
    elementwise op on it gives contiguous strides in eager and keeps its own traced, and
    the `interpolate` or `F.pad` after it chose channels-last traced where eager chose
    contiguous (found by a review: a dropout after drew other masks, outputs 0.25-5.3 off;
    a `view` the graph traced failed at the first step)."""
    return any(t.numel() > 1 and t.stride() != tuple(contiguous_strides(t.shape)) for t in tensors)


def _signature(tree) -> tuple:
    """What decides a kernel's result layout: how `tree` nests (`max_pool2d(x, 4, 2)` and
    `max_pool2d(x, 4, padding=2)` flatten to the same numbers), each tensor's shape,
    strides, dtype and device, every other leaf as it is."""
    leaves, spec = pytree.tree_flatten(tree)
    return (str(spec), *((tuple(a.shape), a.stride(), a.dtype, str(a.device)) if isinstance(a, torch.Tensor)
                         else repr(a) for a in leaves))


def _kernel_layouts(func, args, kwargs) -> list | None:
    """(strides, dtype) of each result of `func` run on zeros laid out as `args`' fakes
    (None for a result that is no tensor), or None where the op fails on zeros (a
    solver's singular matrix)."""
    reals = _run_on(func, args, kwargs)
    return None if reals is None else [(r.stride(), r.dtype) if isinstance(r, torch.Tensor) else None
                                       for r in reals]


def _run_on(func, args, kwargs, device: str | None = None) -> list | None:
    """The results of `func` (a list) run on real tensors laid out as `args`' fakes, zeros
    on their device, or with `device="meta"` meta tensors run outside the Python
    dispatcher (`_meta_strides`); None where it fails."""
    def real(fake):
        return _zeros_as(fake, device) if isinstance(fake, torch.Tensor) else fake

    outside = torch._C._DisablePythonDispatcher() if device == "meta" else contextlib.nullcontext()
    with unset_fake_temporarily(), torch.no_grad(), torch._C._DisableAutocast(), outside:
        try:
            result = func(*pytree.tree_map(real, args), **pytree.tree_map(real, kwargs))
        except Exception:
            return None
    return [result] if isinstance(result, torch.Tensor) else list(result) if isinstance(result, (tuple, list)) else []


def match_kernel_layouts(module: torch.fx.GraphModule) -> int:
    """Lay `module`'s graph out as its kernels run (module docstring), in place; returns
    how many results took a kernel's layout."""
    graph = module.graph
    moved: set[torch.fx.Node] = set()   # nodes whose value is laid out anew
    found = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if any(a in moved for a in node.all_input_nodes) and _relaid(node):
            moved.add(node)
        if not _audited(node):
            continue
        differing = _differing(node)
        if differing:
            node.meta["val"] = _as_made(node.meta["val"], differing)
            moved.add(node)
            found += len(differing)
    if moved:
        graph.lint()
        module.recompile()
    return found


def _relaid(node: torch.fx.Node) -> bool:
    """Compute `node`'s value again from its inputs' (some laid out anew); a view the new
    layout does not allow reads a contiguous clone. Whether its layout changed."""
    if node.target in _ABSOLUTE:
        raise LoweringError(
            f"{node.target} in {node_module(node) or 'the model'} reads a value that a kernel "
            f"lays out otherwise than tracing assumed, with strides fixed at tracing: "
            f"remat-ir cannot run it as eager does. Make the tensor contiguous before that op")
    before = node.meta.get("val")
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: a.meta.get("val"))
    fake = next(t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
    # The graph's ops are autocast's result already: the caller's autocast (a module
    # lowered at a call under `torch.autocast`) must not cast them again.
    with fake.fake_mode, torch._C._DisableAutocast():
        try:
            after = node.target(*args, **kwargs)
        except (RuntimeError, ValueError) as error:   # what a view the strides do not allow raises
            if node.target is not _aten.view.default:
                raise LoweringError(
                    f"{node.target} in {node_module(node) or 'the model'} fails on the layout a "
                    f"kernel before it gives its input, which tracing did not assume ({error}); "
                    f"make that input contiguous before it") from error
            with node.graph.inserting_before(node):
                copy = add_call(node.graph, dict(node.args[0].meta), _aten.clone.default,
                                (node.args[0],), dict(memory_format=torch.contiguous_format))
            node.replace_input_with(node.args[0], copy)
            after = node.target(copy.meta["val"], *args[1:], **kwargs)
    node.meta["val"] = after
    return not _same_values_layout(before, after)


def _same_values_layout(a, b) -> bool:
    """Same dtypes and strides (`same_layout`: dimensions of one element have any stride)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and same_layout(b, a.shape, a.stride())
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b):
        return all(_same_values_layout(x, y) for x, y in zip(a, b))
    return not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor)


def _as_made(value, differing):
    """`value` (a fake tensor or a tuple of them) with the differing results laid out and
    typed as the kernel made them."""
    def relaid(fake, made):
        with fake.fake_mode:
            return torch.empty_strided(fake.shape, made[0], dtype=made[1], device=fake.device)
    if isinstance(value, torch.Tensor):
        return relaid(value, differing[0][2])
    items = list(value)
    for index, traced, real in differing:
        items[index] = relaid(traced, real)
    return type(value)(items) if isinstance(value, tuple) else items


def _audited(node: torch.fx.Node) -> bool:
    """A call whose results may be laid out after its inputs (`_runs`), not in place, with
    a tensor that is not contiguous among its inputs or results."""
    if node.op != "call_function" or not _runs(node.target) or node.target._schema.is_mutable:
        return False
    return _strided([*_inputs(node), *(t for _, t in _results(node))])


def _inputs(node: torch.fx.Node) -> list[torch.Tensor]:
    return [a.meta["val"] for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]


def _results(node: torch.fx.Node) -> list[tuple[int | None, torch.Tensor]]:
    """(position in the returned tuple, or None for a single tensor; its traced value)."""
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return [(None, value)]
    if isinstance(value, (tuple, list)):
        return [(i, v) for i, v in enumerate(value) if isinstance(v, torch.Tensor)]
    return []


def _differing(node: torch.fx.Node) -> list[tuple[int | None, torch.Tensor, tuple]]:
    """(position, traced value, (strides, dtype) the kernel gives it) of each result the
    kernel lays out or types otherwise (batch norm's saved statistics of a bfloat16 input
    are float32 on CPU, where its fake kernel says bfloat16, and its backward refused the
    bfloat16 zeros); none where the op fails on zeros (`_kernel_layouts`)."""
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda arg: arg.meta.get("val"))
    layouts = _kernel_layouts(node.target, args, kwargs) or []
    found = []
    for index, traced in _results(node):
        made = layouts[index or 0] if (index or 0) < len(layouts) else None
        if made is not None and not _same_values_layout(
                traced, torch.empty_strided(traced.shape, made[0], dtype=made[1], device="meta")):
            found.append((index, traced, made))
    return found


def _zeros_as(fake: torch.Tensor, device: str | None = None) -> torch.Tensor:
    """A real tensor of `fake`'s shape, strides, storage offset and dtype, all zeros, on
    `device` (`fake`'s by default; "meta": no data)."""
    span = 1 + sum((size - 1) * stride for size, stride in zip(fake.shape, fake.stride()) if size > 0)
    base = torch.zeros(fake.storage_offset() + (span if fake.numel() else 0), dtype=fake.dtype,
                       device=device or fake.device)
    return base.as_strided(fake.shape, fake.stride(), fake.storage_offset())
