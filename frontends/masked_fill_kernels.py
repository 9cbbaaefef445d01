"""`masked_fill`'s gradient of a tensor value as eager computes it, for tracing.

Why: eager's backward of `masked_fill(x, mask, value)` gives `value` the sum of the
gradient's masked elements (`grad.masked_select(mask).sum()`), where tracing takes the
formula PyTorch keeps for tensor subclasses, `where(mask, grad, 0).sum()`: other bits
(`torchlib/masked_fill_grads.py`). So while tracing, `aten.masked_fill.Tensor` runs as an
autograd Function whose backward gives `x` eager's `grad.masked_fill(mask, 0)` and
`value` the op `remat_ir::masked_fill_value_grad`, which runs eager's formula; so does
`masked_fill_`, in place.
"""

from __future__ import annotations

import torch
from torch._C import DispatchKey

from remat_ir.torchlib.masked_fill_grads import masked_fill_value_grad

_aten = torch.ops.aten


class _MaskedFill(torch.autograd.Function):
    """`aten.masked_fill.Tensor` with eager's backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, mask: torch.Tensor, value: torch.Tensor):
        with torch._C._AutoDispatchBelowAutograd():
            result = _aten.masked_fill.Tensor(x, mask, value)
        ctx.save_for_backward(mask)
        ctx.value_shape = value.shape
        return result

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (mask,) = ctx.saved_tensors
        grad_x = grad.masked_fill(mask, 0) if ctx.needs_input_grad[0] else None
        grad_value = (masked_fill_value_grad(grad, mask).reshape(ctx.value_shape)
                      if ctx.needs_input_grad[2] else None)
        return grad_x, None, grad_value


class _MaskedFillInPlace(_MaskedFill):
    """`aten.masked_fill_.Tensor`, in place, with the same backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, mask: torch.Tensor, value: torch.Tensor):
        with torch._C._AutoDispatchBelowAutograd():
            _aten.masked_fill_.Tensor(x, mask, value)
        ctx.mark_dirty(x)
        ctx.save_for_backward(mask)
        ctx.value_shape = value.shape
        return x


def _masked_fill(x: torch.Tensor, mask: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return _MaskedFill.apply(x, mask, value)


def _masked_fill_(x: torch.Tensor, mask: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return _MaskedFillInPlace.apply(x, mask, value)


#: The Autograd-key kernels `frontends/torch.py` installs while tracing.
KERNELS = {_aten.masked_fill.Tensor: _masked_fill, _aten.masked_fill_.Tensor: _masked_fill_}
KEY = DispatchKey.Autograd
