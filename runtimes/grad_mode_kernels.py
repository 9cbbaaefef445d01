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
"""

from __future__ import annotations

import torch
from torch.utils import _pytree as pytree

#: The overloads run with grad mode on (module docstring).
GRAD_MODE_OPS = frozenset({"aten.mkldnn_rnn_layer.default"})


def kernel(name: str, op):
    """What runs `op` (the OpOverload named `name`) as eager's training call does: `op`
    itself, or for `GRAD_MODE_OPS` a function calling it with grad mode on."""
    if name not in GRAD_MODE_OPS:
        return getattr(op, "_op", op)

    def with_grad_mode(*args, **kwargs):
        args, kwargs = pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, (args, kwargs))
        with torch.enable_grad():
            return op(*args, **kwargs)
    with_grad_mode.__name__ = f"{name.replace('.', '_')}_with_grad_mode"
    return with_grad_mode
