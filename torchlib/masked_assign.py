"""`remat_ir::put_masked`: `x[mask] = values` as one op of fixed shapes, run with eager's
kernels forward and backward.

Why: eager runs `x[mask] = values` as `index_put_` with a boolean index, and its
backward gives `values` the sum of the gradient's masked rows, `grad[mask]`, whose
number of rows depends on the mask's data. Traced, that backward has no fixed shape,
so a model assigning a trainable tensor through a mask (a masked autoencoder's
`tokens[mask] = self.mask_token`, wav2vec2's SpecAugment `hidden_states[mask] =
self.masked_spec_embed` in pretraining) was refused. With `values` needing no gradient
the traced backward has fixed shapes and eager's ops are traced as they are.

The op takes the tensor, the mask, how many full dimensions come before the mask (the
`x[:, mask]` form) and the values, and returns a new tensor: the functional
`index_put`, whose result takes `x`'s layout as eager's in-place one keeps it. Its
backward is a second op that runs eager's formula: the gradient with zeros put at the
mask for `x`, and `grad[mask]` summed to the values' shape (`sum_to_size`, as autograd
reduces a broadcast) for the values. Both run the kernels eager runs on the same
tensors, so the step computes eager's bits; neither draws random numbers. Registered
when `remat_ir.torchlib.types` is imported, which every frontend and runtime does
(`frontends/masked_assign.py` puts the op where a forward assigns through a mask).
"""

from __future__ import annotations

import functools

import torch

from remat_ir.ir.dtypes import dtype_from_name, nbytes

NAME = "remat_ir::put_masked"
OP, BACKWARD_OP = "remat_ir.put_masked.default", "remat_ir.put_masked_backward.default"


def _indices(mask: torch.Tensor, leading: int) -> list:
    return [None] * leading + [mask]


@torch.library.custom_op(NAME, mutates_args=())
def put_masked(tensor: torch.Tensor, mask: torch.Tensor, leading: int,
               values: torch.Tensor) -> torch.Tensor:
    """`tensor` with `values` put where the boolean `mask` (over its dimensions from
    `leading` on) is set: eager's `tensor[..., mask] = values` on a copy."""
    return torch.ops.aten.index_put.default(tensor, _indices(mask, leading), values)


@put_masked.register_fake
def _(tensor, mask, leading, values):
    return torch.empty_like(tensor)


@torch.library.custom_op(f"{NAME}_backward", mutates_args=())
def put_masked_backward(grad: torch.Tensor, mask: torch.Tensor, leading: int,
                        values_shape: list[int], values_dtype: torch.dtype,
                        values_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(gradient of the tensor, gradient of the values) as eager's `index_put_` backward
    computes them; zeros for the values where `values_grad` is False."""
    indices = _indices(mask, leading)
    zeros = torch.zeros(values_shape, dtype=values_dtype, device=grad.device)
    grad_tensor = torch.ops.aten.index_put.default(grad, indices, zeros)
    if not values_grad:
        return grad_tensor, zeros
    return grad_tensor, torch.ops.aten.index.Tensor(grad, indices).sum_to_size(values_shape)


@put_masked_backward.register_fake
def _(grad, mask, leading, values_shape, values_dtype, values_grad):
    return torch.empty_like(grad), grad.new_empty(values_shape, dtype=values_dtype)


def _setup(ctx, inputs, output):
    _, mask, leading, values = inputs
    ctx.save_for_backward(mask)
    ctx.leading, ctx.values_shape, ctx.values_dtype = leading, list(values.shape), values.dtype


def _backward(ctx, grad):
    (mask,) = ctx.saved_tensors
    wanted = ctx.needs_input_grad[3]
    grad_tensor, grad_values = put_masked_backward(grad, mask, ctx.leading, ctx.values_shape,
                                                   ctx.values_dtype, wanted)
    return grad_tensor, None, None, grad_values if wanted else None


put_masked.register_autograd(_backward, setup_context=_setup)


def workspace_bytes(op: str, args: list) -> int:
    """Bytes `op` (`OP` or `BACKWARD_OP`), called on `args` (tensors of any device, meta
    included), may allocate beyond its results, whatever the mask holds: the indices
    `nonzero` makes of the mask (int64, one row per set element, all of them set), and in
    the backward the values' zeros and `grad[mask]`, as large as the gradient when every
    element is set. Why declared: run on synthetic inputs the mask is whatever they draw,
    so a plan's budget was missed by the rows a real mask sets beyond them (a random
    network at 50% of its peak: 27,928 bytes measured, budget 25,368; found by soaking)."""
    mask = args[1]
    indices = mask.numel() * max(1, mask.dim()) * torch.int64.itemsize
    if op == OP:
        return indices
    grad, values_shape, values_dtype, values_grad = args[0], args[3], args[4], args[5]
    if not isinstance(values_dtype, torch.dtype):   # as a graph holds it (`ir.arguments.DTypeArg`)
        zeros = nbytes(dtype_from_name(values_dtype.name), list(values_shape))
    else:
        zeros = torch.Size(values_shape).numel() * values_dtype.itemsize
    return indices + zeros + (grad.numel() * grad.element_size() if values_grad else 0)


#: Both ops' workspaces, from their arguments (`types.DECLARED_WORKSPACES`).
WORKSPACES = {op: functools.partial(workspace_bytes, op) for op in (OP, BACKWARD_OP)}
