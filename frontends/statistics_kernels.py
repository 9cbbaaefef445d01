"""`torch.cov` and `torch.corrcoef` traced as eager computes them.

Why: ATen's `cov` decides whether the degrees of freedom are positive by reading a tensor
(`is_nonzero(norm_factor.le(0))`, an `aten.equal` of two tensors), which tracing cannot:
a forward calling it (a VICReg or Barlow Twins loss, a whitening layer) was refused as
"an op whose value depends on tensor data". Without weights that number is the count of
observations less the correction, known from the shapes.

So while tracing, `aten.cov` called without weights runs `cov` below: ATen's ops in
ATen's order (the observations' mean as a sum divided by their count held in a tensor,
the product of the centred observations with their conjugate transpose, divided by the
degrees of freedom held in a tensor), the branch taken from the shapes, with eager's
warning where the degrees of freedom are not positive. `corrcoef` is a composite of
`cov`, and follows. With weights (`fweights`, `aweights`), the degrees of freedom depend
on their values: ATen's kernel is called, and tracing refuses it as before.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
from torch._C import DispatchKey

aten = torch.ops.aten


def cov(input: torch.Tensor, correction: int = 1, fweights: torch.Tensor | None = None,
        aweights: torch.Tensor | None = None) -> torch.Tensor:
    """ATen's `cov` without weights, op for op (module docstring); with weights, ATen's."""
    if fweights is not None or aweights is not None:
        return aten.cov.default._op_dk(DispatchKey.CompositeImplicitAutograd, input, correction=correction,
                                       fweights=fweights, aweights=aweights)
    torch._check(input.dim() <= 2, lambda: f"cov(): expected input to have two or fewer dimensions but got "
                                           f"an input with {input.dim()} dimensions")
    torch._check(input.dtype != torch.bool, lambda: "cov(): bool dtype is not supported for input")
    observations = input if input.dim() == 2 else aten.view(input, [1, -1])
    count = observations.shape[1]
    total = aten.scalar_tensor(count, dtype=torch.long, device=input.device)
    mean = aten.div(aten.sum(observations, [1]), total)
    degrees = count - correction
    if degrees <= 0:
        warnings.warn("cov(): degrees of freedom is <= 0. Correction should be strictly less than the "
                      "number of observations.")
        degrees = 0
    factor = aten.scalar_tensor(degrees, dtype=torch.long, device=input.device)
    centred = aten.sub(observations, aten.unsqueeze(mean, 1))
    product = aten.mm(centred, aten.conj(aten.t(centred)))
    return aten.squeeze(aten.div(product, factor))


@contextlib.contextmanager
def statistics_traced_as_eager():
    """Within (around torch.export's tracing, which decomposes `cov`): `aten.cov` runs
    `cov`; the kernel before is put back on exit."""
    op, key = aten.cov.default, DispatchKey.CompositeImplicitAutograd
    before = op.py_kernels.get(key)
    op.py_kernels[key] = cov
    op._dispatch_cache.clear()
    try:
        yield
    finally:
        if before is None:
            op.py_kernels.pop(key, None)
        else:
            op.py_kernels[key] = before
        op._dispatch_cache.clear()


#: Op -> the Python kernel AOTAutograd's tracing runs for it (under `KEY`), where the
#: exported program kept the op whole (`torch.py`'s `_eager_kernels`).
KERNELS = {aten.cov.default: cov}
KEY = DispatchKey.CompositeImplicitAutograd
