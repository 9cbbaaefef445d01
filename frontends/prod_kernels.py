"""`torch.prod`'s gradient as eager computes it, for tracing.

Why: eager's backward of `prod` (ATen's `prod_backward`) looks at the input's values: an
input without zeros gets `grad * result / input`, one with zeros the zero-safe formula
(the products of the elements before and after each one, by two cumulative products).
Tracing cannot branch on values, so PyTorch's formula takes the zero-safe path for every
traced tensor: other bits for inputs without zeros (gradients up to 6e-7 relative off
eager's, under every schedule; an op sweep found it).

So while tracing, `aten.prod` (over all elements, and over one dimension) runs as an
autograd Function whose backward computes both formulas and selects eager's by whether
the input holds a zero (`torch.where` on that one flag): eager's bits either way, at the
cost of computing the other formula too. An input with two zeros or more, over all
elements, gets zeros as in eager (its zero-safe formula yields zeros there).
"""

from __future__ import annotations

import torch
from torch._C import DispatchKey

_aten = torch.ops.aten


def _zero_safe(grad: torch.Tensor, inp: torch.Tensor, dim: int) -> torch.Tensor:
    """ATen's `prod_safe_zeros_backward`, op for op."""
    if inp.numel() == 0:
        return grad.expand_as(inp)
    if inp.size(dim) == 1:
        return grad
    size = list(inp.shape)
    size[dim] = 1
    ones = torch.ones(size, dtype=grad.dtype, device=grad.device)
    before = torch.cat([ones, inp.narrow(dim, 0, inp.size(dim) - 1)], dim).cumprod(dim)
    after = torch.cat([ones, inp.narrow(dim, 1, inp.size(dim) - 1).flip(dim)], dim).cumprod(dim).flip(dim)
    return grad * (before * after).conj()


class _Prod(torch.autograd.Function):
    """`aten.prod` with eager's `prod_backward`, both of its paths, chosen by value."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int | None, keepdim: bool):
        with torch._C._AutoDispatchBelowAutograd():
            result = _aten.prod.default(x) if dim is None else _aten.prod.dim_int(x, dim, keepdim)
        ctx.save_for_backward(x, result)
        ctx.dim, ctx.keepdim = dim, keepdim
        return result

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, result = ctx.saved_tensors
        if x.dim() == 0:
            return grad, None, None
        if ctx.dim is None:
            safe = _zero_safe(grad, x.contiguous().view(-1), 0).view_as(x)
        else:
            dim = ctx.dim % x.dim()
            if not ctx.keepdim:
                grad, result = grad.unsqueeze(dim), result.unsqueeze(dim)
            safe = _zero_safe(grad, x, dim)
        fast = grad * (result / x).conj()
        return torch.where((x == 0).any(), safe, fast), None, None


def _prod(x: torch.Tensor, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    return _Prod.apply(x if dtype is None else x.to(dtype), None, False)


def _prod_dim(x: torch.Tensor, dim: int, keepdim: bool = False, *,
              dtype: torch.dtype | None = None) -> torch.Tensor:
    return _Prod.apply(x if dtype is None else x.to(dtype), dim, keepdim)


#: The Autograd-key kernels `frontends/torch.py` installs while tracing.
KERNELS = {_aten.prod.default: _prod, _aten.prod.dim_int: _prod_dim}
KEY = DispatchKey.Autograd
