"""Ops whose kernels make an output the backward reads only while grad mode is on.

Why: oneDNN's LSTM layer (`aten.mkldnn_rnn_layer`, which eager's CPU `nn.LSTM` runs and
remat-ir's trace keeps: `frontends/torch.py`'s `RNN_EAGER_KERNEL_OPS`) returns the
workspace its backward reads only with grad mode on (in training or eval mode); under
`torch.no_grad` it returns None. The runtime runs every segment under no_grad (inside an autograd
Function), and profiling times ops under no_grad too: the backward then failed ("Expected
a proper Tensor but got None for argument 'workspace'"), and the workspace's bytes
(32 KiB for a 16-wide layer over 5 steps of 4) were missing from the measured sizes.

So these ops run with grad mode on, on detached arguments: nothing is recorded for
autograd (no argument requires a gradient), and the kernel computes what eager's
training call computes.

Likewise `aten.native_group_norm_backward`, whose gradient eager's derivative formula makes
contiguous first (derivatives.yaml: `grads[0].contiguous(input.suggest_memory_format())`
on CPU), a copy the joint graph, traced with contiguous gradients, does not hold: handed
`out.sum()`'s broadcast gradient (all strides 0), or one an elementwise op left permuted
(a loss reading the output transposed), the CPU kernel read it as contiguous: NaN, 1e35,
or gradients 10 to 140 off, silently (hunt86 F0, hunt87 F1). It runs on the gradient laid
out as eager's formula lays it out.
"""

from __future__ import annotations

import torch
from torch._prims_common import suggest_memory_format
from torch.utils import _pytree as pytree

#: The overloads run with grad mode on (module docstring).
GRAD_MODE_OPS = frozenset({"aten.mkldnn_rnn_layer.default"})


#: The overloads whose first argument, a gradient, eager's formula makes contiguous.
CONTIGUOUS_GRADIENT_OPS = frozenset({"aten.native_group_norm_backward.default"})


def _contiguous_gradient(name: str, op):
    """`op` called on its gradient as eager's formula lays it out (module docstring)."""
    def with_eagers_gradient(grad, input, *args, **kwargs):
        if grad.device.type != "xpu":
            layout = suggest_memory_format(input) if grad.device.type == "cpu" else torch.contiguous_format
            grad = grad.contiguous(memory_format=layout)
        return op(grad, input, *args, **kwargs)
    with_eagers_gradient.__name__ = f"{name.replace('.', '_')}_with_eagers_gradient"
    return with_eagers_gradient


def kernel(name: str, op):
    """What runs `op` (the OpOverload named `name`) as eager's training call does: `op`
    itself, for `GRAD_MODE_OPS` a function calling it with grad mode on, for
    `CONTIGUOUS_GRADIENT_OPS` one calling it on a contiguous gradient."""
    if name in CONTIGUOUS_GRADIENT_OPS:
        return _contiguous_gradient(name, getattr(op, "_op", op))
    if name not in GRAD_MODE_OPS:
        return getattr(op, "_op", op)

    def with_grad_mode(*args, **kwargs):
        args, kwargs = pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, (args, kwargs))
        with torch.enable_grad():
            return op(*args, **kwargs)
    with_grad_mode.__name__ = f"{name.replace('.', '_')}_with_grad_mode"
    return with_grad_mode
