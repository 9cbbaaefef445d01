"""Dropout as a random mask and a product: recomputing its output draws nothing.

Why: `aten.native_dropout` returns both the dropped-out tensor and its mask, so a
plan that frees the output can only get it back by running the op again, which
draws the mask again (RNG replay) at the cost of the draw: on CPU, Bernoulli
sampling is most of the op (the quick GPT-2, 4 layers: 13 dropouts are 25% of the
step; one over attention probabilities takes 6 ms where `native_dropout_backward`,
the same product, takes 0.6 ms). torch.compile's partitioner recomputes dropout
inside its backward graph (13 times on that GPT-2 at budget 0.5); remat-ir
recomputes the product from the mask it already has to keep for the backward (a
boolean, a quarter of a float tensor).

The rewrite, on the joint FX graph before lowering (`split_dropout`), for each
`native_dropout(x, p, train)` of a training step on CPU:

    empty = empty_like(x, dtype=bool)       # shape and layout only
    mask  = bernoulli.p(empty, 1 - p)       # the one random node
    kept  = mul.Tensor(x, mask)             # x or 0 (with x's sign), exactly
    out   = mul.Tensor(kept, scale)         # scale = 1 / (1 - p) rounded to x's dtype

which draws as eager's CPU kernel does (`native_dropout_cpu`: an empty boolean
tensor filled by `bernoulli_(1 - p)`) and multiplies as it does in torch 2.13 (by
the scale in the input's dtype: in bfloat16 1/0.9 is 1.109375, and multiplying by
the double 1/0.9 gives other bits), so the mask, the output and the generator's
state after it are eager's, bit for bit (tests/test_rng.py checks it over dtypes).
The backward becomes the same two products on the gradient (`grad * mask * scale`),
which is what eager's backward of its `input * noise` computes; `native_dropout_backward`
multiplies by the unrounded scale instead (other bits in bfloat16).

Left as it is: dropout on another device (CUDA's fused kernel draws with Philox in
another order, so the same split would not give eager's mask), on an input that is
not contiguous (`bernoulli.p` returns a contiguous result, where eager's mask follows
the input's layout and so pairs draws with other elements; its backward still becomes the
two products: bfloat16 gradients below `nn.TransformerEncoderLayer(batch_first=True)`'s
dropout over attention's transposed output were 9e-3 off eager's), and `p` of 0 or
`train=False` (nothing is drawn). `p` of 1 gets a mask of zeros and scale 0, drawing
nothing as eager's kernel does (returns the input times zero), in any layout; PyTorch's
decomposition draws a mask there, which left the generator elsewhere than eager.
"""

from __future__ import annotations

import operator

import torch
import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .fx_nodes import add_call, recompiled, replace

_aten = torch.ops.aten

#: Bumped when the rewrite changes the graphs it makes: benchmark caches of lowered graphs
#: key on it (benchmarks/solvers.py).
REVISION = 6


def _training_dropout(node: torch.fx.Node) -> tuple[torch.fx.Node, float] | None:
    """(input, p) where `node` is a native_dropout of a training step on CPU that draws
    (eager's CPU kernel: `input * noise`), else None."""
    if node.op != "call_function" or node.target is not _aten.native_dropout.default:
        return None
    x, p = node.args[0], node.args[1]
    train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train")
    fake = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if (train is False or not isinstance(p, (int, float)) or not 0 < p <= 1
            or getattr(fake, "fake_mode", None) is None or fake.device.type != "cpu"
            or not fake.dtype.is_floating_point):
        return None
    if any(user.target is not operator.getitem for user in node.users):
        return None
    return x, float(p)


def _rounded_scale(p: float, dtype: torch.dtype) -> float:
    """What eager's CPU dropout's noise holds where it keeps an element, 0 for p = 1: its
    mask divided in place by 1 - p in `dtype` (`noise.div_(1 - p)`), which is not always
    1 / (1 - p) computed in double and rounded to `dtype`: in float32 they differ by one
    ulp for 226 of the 999 p = i / 1000, 0.15 and 0.45 among them (hunt76: every output
    and gradient 1.2e-6 off eager's under every schedule)."""
    p1m = 1.0 - p
    with unset_fake_temporarily():   # AOTAutograd's fake mode may still be on
        return float(torch.ones((), dtype=dtype).div_(p1m)) if p1m else 0.0


def _kernels_scale(p: float, dtype: torch.dtype) -> float:
    """The scale `native_dropout`'s CPU kernel multiplies by: 1 / (1 - p) in double, rounded
    to `dtype`. Where it is eager's (`_rounded_scale`: p = 0.1, 0.5 and most others), a
    kept dropout's output is eager's and is kept, which costs no products beside it
    (hunt79: computed as products at every p, a channels-last dropout's floor rose from
    81% to 92% of store-everything)."""
    with unset_fake_temporarily():
        return float(torch.tensor(1.0 / (1.0 - p), dtype=dtype))


def _takes_over(new: torch.fx.Node, old: torch.Tensor) -> None:
    """Give `new` the fake result of the dropout output it replaces (same shape, dtype and
    layout). Why: the traced views of that output (a transpose before a matrix product)
    keep fake results over the old fake storage, and the lowering groups values into
    storages by fake storage; with a fresh fake result the views would sit on a storage
    no node computes, each counted as an allocation of its own (4 KiB per view of a
    16x64 dropout output that the step never allocated)."""
    fresh = new.meta["val"]
    if (fresh.shape, fresh.dtype, fresh.stride()) == (old.shape, old.dtype, old.stride()):
        new.meta["val"] = old


def _as_products(graph: torch.fx.Graph, backward: torch.fx.Node, mask: torch.fx.Node,
                 scale: float) -> None:
    """Replace `native_dropout_backward(grad, mask, 1 / (1 - p))` by the products eager's
    backward computes: eager's CPU dropout is `input * noise` with `noise` the mask
    divided by 1 - p in the input's dtype, so its gradient is `grad * noise`, while
    `native_dropout_backward` multiplies by the unrounded double scale. Equal in float32;
    in bfloat16 the scale rounds (1/0.9 to 1.109375) and the two differ in the last bits
    (every gradient below a dropout of the tests' GPT-2 under bf16 autocast did)."""
    grad = backward.args[0]
    meta = {k: v for k, v in backward.meta.items() if k != "val"}
    with grad.meta["val"].fake_mode, graph.inserting_before(backward):
        kept = add_call(graph, meta, _aten.mul.Tensor, (grad, mask))
        product = add_call(graph, meta, _aten.mul.Tensor, (kept, scale))
    replace(backward, product)


def _backwards_as_products(graph: torch.fx.Graph, mask: torch.fx.Node, scale: float) -> None:
    """Each `native_dropout_backward` reading `mask` as eager's products (`_as_products`)."""
    for backward in [u for u in mask.users if u.target is _aten.native_dropout_backward.default]:
        _as_products(graph, backward, mask, scale)


def _kept_as_products(graph: torch.fx.Graph, node: torch.fx.Node, x: torch.fx.Node, scale: float) -> None:
    """For a dropout kept whole (an input that is not contiguous): its mask kept, its output
    and backward eager's products (`input * noise`) of it: the kernel multiplies by the
    unrounded double scale, one ulp off eager's in float32 for some p (hunt76)."""
    masks = [u for u in node.users if u.args[1] == 1]
    meta = {k: v for k, v in node.meta.items() if k != "val"}
    with x.meta["val"].fake_mode:
        if not masks:
            with graph.inserting_after(node):
                masks = [add_call(graph, meta, operator.getitem, (node, 1))]
        mask = masks[0]
        for output in [u for u in node.users if u.args[1] == 0]:
            with graph.inserting_after(mask):
                kept = add_call(graph, meta, _aten.mul.Tensor, (x, mask))
            with graph.inserting_after(kept):
                product = add_call(graph, meta, _aten.mul.Tensor, (kept, scale))
            _takes_over(product, output.meta["val"])
            replace(output, product)
    for mask in masks:
        _backwards_as_products(graph, mask, scale)


def split_dropout(module: torch.fx.GraphModule) -> int:
    """Rewrite every splittable `native_dropout` of `module`'s graph in place, and the
    backward of those kept (module docstring); returns how many were rewritten."""
    graph = module.graph
    rewritten = 0
    for node in list(graph.nodes):
        found = _training_dropout(node)
        if found is None:
            continue
        x, p = found
        fake_x = x.meta["val"]
        scale = _rounded_scale(p, fake_x.dtype)
        # Kept where not contiguous (module docstring), its backward as eager's; but for p
        # of 1, which draws nothing in any layout (kept, its kernel drew a mask: eager's
        # generator state was lost, and every later draw with it, found by a review).
        if not fake_x.is_contiguous() and p != 1.0:
            if scale != _kernels_scale(p, fake_x.dtype):
                _kept_as_products(graph, node, x, scale)
            else:   # the kernel's output is eager's: kept, its backward eager's products
                for mask in [u for u in node.users if u.args[1] == 1]:
                    _backwards_as_products(graph, mask, scale)
            rewritten += 1
            continue
        meta = {k: v for k, v in node.meta.items() if k != "val"}
        p1m = 1.0 - p
        with fake_x.fake_mode, graph.inserting_before(node):
            if p1m:
                empty = add_call(graph, meta, _aten.empty_like.default, (x,), {"dtype": torch.bool})
                mask = add_call(graph, meta, _aten.bernoulli.p, (empty, p1m))
            else:   # p = 1: eager's CPU dropout multiplies by zero and draws nothing
                mask = add_call(graph, meta, _aten.zeros_like.default, (x,), {"dtype": torch.bool})
            kept = add_call(graph, meta, _aten.mul.Tensor, (x, mask))
            out = add_call(graph, meta, _aten.mul.Tensor, (kept, scale))
        _takes_over(out, node.meta["val"][0])
        _takes_over(mask, node.meta["val"][1])
        for user in list(node.users):
            replace(user, out if user.args[1] == 0 else mask)
        graph.erase_node(node)
        _backwards_as_products(graph, mask, scale)
        rewritten += 1
    return recompiled(module, rewritten)
