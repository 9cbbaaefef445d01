"""The gradient of a whole-tensor `max`, `min`, `median` or `nanmedian` as eager computes it.

Why: these reductions hand the gradient evenly to every element equal to the result
(ATen's `evenly_distribute_backward`). On CPU, eager fills zeros and writes the share where
the mask is set (`new_zeros(...).masked_fill_(mask, grad / count)`); for a tensor subclass,
what tracing runs on, ATen multiplies the mask by the share (`mask * (grad / count)`), so
under a negative gradient every other element's gradient is -0.0 where eager's is +0.0:
equal values, other bits, which `1 / x`, `copysign` and `atan2` tell apart, under every
schedule (hunt76 F8).

So while tracing, those four ops run as an autograd Function whose backward is eager's CPU
formula, its one read of a value (whether the result is NaN, which picks the mask) taken
as a `where` on both masks. On CUDA eager multiplies too, and the Function does as it does.
"""

from __future__ import annotations

import torch
from torch._C import DispatchKey

_aten = torch.ops.aten


def evenly_distributed(grad: torch.Tensor, x: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """ATen's `evenly_distribute_backward`, on the device's path."""
    if x.is_cuda:
        mask = (x == result).logical_or(x.isnan().logical_and(result.isnan()))
        return mask * (grad / mask.sum())
    mask = torch.where(result.isnan(), x.isnan(), x == result)
    return grad.new_zeros(x.shape, dtype=x.dtype).masked_fill(mask, grad / mask.sum())


def _evenly(op):
    """`op` (a whole-tensor reduction picking an element) with eager's backward."""

    class Evenly(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x: torch.Tensor):
            with torch._C._AutoDispatchBelowAutograd():
                result = op(x)
            ctx.save_for_backward(x, result)
            return result

        @staticmethod
        def backward(ctx, grad: torch.Tensor):
            x, result = ctx.saved_tensors
            return evenly_distributed(grad, x, result)

    Evenly.__name__ = f"Evenly_{op.__name__.split('.')[0]}"
    return lambda x: Evenly.apply(x)


#: The Autograd-key kernels `frontends/torch.py` installs while tracing.
KERNELS = {op: _evenly(op) for op in (_aten.max.default, _aten.min.default, _aten.median.default,
                                      _aten.nanmedian.default)}
KEY = DispatchKey.Autograd
