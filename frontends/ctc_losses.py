"""The CTC loss traced as `remat_ir::ctc_loss` (`torchlib/ctc_loss.py`), an op of fixed
shapes, its targets taken inside it where the forward selects them by a mask.

Why: `torch.ctc_loss` (hence `F.ctc_loss` and `nn.CTCLoss`) keeps tensors whose shape
is read from the target lengths' values, and transformers' speech models for
recognition (`ForCTCLoss`) select the targets from the padded labels with
`labels.masked_select(mask)`, a tensor of as many elements as the mask has set: the
step had no fixed shapes and every model computing a CTC loss in its forward was
refused.

`ctc_losses_as_one_op`, while torch.export traces, makes a call of `torch.ctc_loss` on
traced tensors a call of the op, with the cuDNN flag the call ran under; under autocast
it casts half-precision log probabilities to float32 first, as autocast does for
`ctc_loss` (the op, PyTorch's own, has no autocast rule).
`fold_target_selections`, on the module torch.export made, gives the op `labels` and
`mask` where its targets are `labels.masked_select(mask)` (or `labels[mask]`, the mask
of the labels' shape), maybe followed by elementwise ops (a cast, a shift by a number:
applied to every label first), and drops the selection, which nothing else reads but
the checks torch.export adds on its size. A selection read elsewhere too stays, and the model is
refused as before, where it reads it.
"""

from __future__ import annotations

import contextlib
import operator

import torch
import torch.fx
from torch._subclasses.fake_tensor import is_fake

from remat_ir.torchlib import ctc_loss as ctc_op

from .fx_nodes import add_call, recompiled

_aten = torch.ops.aten
_OP = torch.ops.remat_ir.ctc_loss.default
#: ATen's `Reduction::Mean`, `torch.ctc_loss`'s default.
_MEAN = 1
#: Ops on the selected targets that give the same targets taken on every label first
#: (`labels[mask].int()`, `- 1` to shift the classes). None of them can raise on a label
#: the mask leaves out.
_ELEMENTWISE = (_aten._to_copy.default, _aten.to.dtype, _aten.to.dtype_layout, _aten.to.device,
                _aten.add.Tensor, _aten.add.Scalar, _aten.sub.Tensor, _aten.sub.Scalar,
                _aten.clamp.default, _aten.clamp_min.default, _aten.clamp_max.default)
#: Nodes that read only a selection's size or metadata: torch.export's checks that its size
#: is in range, and of its dtype before a `.to(...)`.
_SIZE_READS = (_aten.sym_size.int, _aten.sym_numel.default, _aten._assert_scalar.default,
               _aten._assert_tensor_metadata.default)


@contextlib.contextmanager
def ctc_losses_as_one_op():
    """Within: `torch.ctc_loss` on traced tensors calls `remat_ir::ctc_loss`; on tensors
    with values it runs as eager's."""
    original = torch.ctc_loss

    def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction=_MEAN,
                 zero_infinity=False):
        tensors = [t for t in (log_probs, targets, input_lengths, target_lengths)
                   if isinstance(t, torch.Tensor)]
        as_tensors = isinstance(input_lengths, torch.Tensor) and isinstance(target_lengths, torch.Tensor)
        as_lists = not isinstance(input_lengths, torch.Tensor) and not isinstance(target_lengths, torch.Tensor)
        if not any(is_fake(t) for t in tensors) or not (as_tensors or as_lists):
            return original(log_probs, targets, input_lengths, target_lengths, blank, reduction,
                            zero_infinity)   # eager's, or eager's argument error
        if (torch.is_autocast_enabled(log_probs.device.type)
                and log_probs.dtype in (torch.float16, torch.bfloat16)):
            log_probs = log_probs.float()   # autocast's policy for ctc_loss: float32
        lists = ([], []) if as_tensors else (list(input_lengths), list(target_lengths))
        lengths = (input_lengths, target_lengths) if as_tensors else (None, None)
        return ctc_op.ctc_loss(log_probs, targets, None, *lengths, *lists, blank, int(reduction),
                               bool(zero_infinity), torch.backends.cudnn.enabled)

    torch.ctc_loss = ctc_loss
    try:
        yield
    finally:
        torch.ctc_loss = original


def fold_target_selections(module: torch.fx.GraphModule) -> int:
    """Rewrite `module` (from torch.export, in place) as the docstring says; the number of
    selections folded into a loss."""
    count, graph = 0, module.graph
    for node in list(graph.nodes):
        if node.target is not _OP or node.args[2] is not None:
            continue
        chain, selection = [], node.args[1]
        while _elementwise(selection):   # outermost first: `labels[mask].int() - 1`
            chain.append(selection)
            selection = selection.args[0]
        selected = _selection(selection)
        doomed = None if selected is None else _only_feeding(node, [*chain, selection])
        if doomed is None:   # no selection, or one read elsewhere too: kept
            continue
        labels, mask = selected
        with graph.inserting_before(node), labels.meta["val"].fake_mode:
            for op in reversed(chain):   # the same elementwise ops, on every label
                labels = add_call(graph, op.meta, op.target, (labels, *op.args[1:]), op.kwargs)
        node.args = (node.args[0], labels, mask, *node.args[3:])
        for each in reversed(list(graph.nodes)):   # readers before what they read
            if each in doomed:
                graph.erase_node(each)
        count += 1
    return recompiled(module, count)


def _elementwise(node) -> bool:
    """Whether `node` is one of `_ELEMENTWISE` on one tensor (its other arguments plain):
    the same on the selected targets as on every label, then selected."""
    return (isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in _ELEMENTWISE
            and isinstance(node.args[0], torch.fx.Node)
            and not any(isinstance(a, torch.fx.Node) for a in (*node.args[1:], *node.kwargs.values())))


def _only_feeding(loss: torch.fx.Node, nodes: list[torch.fx.Node]) -> set[torch.fx.Node] | None:
    """`nodes` (a chain, each read by the one before it, the first by `loss`) and the
    checks torch.export reads their sizes and metadata with, where nothing else reads them;
    else None."""
    doomed, reader = set(nodes), loss
    for node in nodes:
        reads = _size_reads(node, besides=reader)
        if reads is None:
            return None
        doomed |= reads
        reader = node
    return doomed


def _selection(node) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """(labels, mask) where `node` is `labels.masked_select(mask)` or `labels[mask]` with a
    boolean mask of the labels' shape (the same elements in the same order), else None."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    if node.target is _aten.masked_select.default:
        return node.args[0], node.args[1]
    if node.target is _aten.index.Tensor and len(node.args[1]) == 1:
        labels, (mask,) = node.args[0], node.args[1]
        fake_labels, fake_mask = (n.meta.get("val") if isinstance(n, torch.fx.Node) else None
                                  for n in (labels, mask))
        if (isinstance(fake_mask, torch.Tensor) and isinstance(fake_labels, torch.Tensor)
                and fake_mask.dtype == torch.bool and fake_mask.shape == fake_labels.shape):
            return labels, mask
    return None


def _size_reads(node: torch.fx.Node, besides: torch.fx.Node) -> set[torch.fx.Node] | None:
    """Every node but `besides` reading `node` and, through them, what they compute, where
    each only reads its size, compares it, checks the comparison or checks its metadata;
    None where one does more."""
    found, stack = set(), [user for user in node.users if user is not besides]
    while stack:
        user = stack.pop()
        if user in found:
            continue
        if user.op != "call_function" or not (
                user.target in _SIZE_READS
                or getattr(operator, getattr(user.target, "__name__", ""), None) is user.target):
            return None
        found.add(user)
        stack.extend(user.users)
    return found
