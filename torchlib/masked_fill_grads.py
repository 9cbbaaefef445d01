"""`remat_ir::masked_fill_value_grad`: the gradient of `masked_fill`'s tensor value as
eager computes it.

Why: eager's backward of `x.masked_fill(mask, value)` gives a tensor `value` the sum of
the gradient's masked elements, `grad.masked_select(mask).sum()` (ATen's
`masked_fill_backward`), a sum over as many elements as the mask sets. Traced, PyTorch
takes the formula it keeps for tensor subclasses, `where(mask, grad, 0).sum()`: a sum of
other length, in another order, other bits (a 5 x 5 input's value gradient 7.6e-6 off,
1e-3 on 32 x 32, under every schedule; found by an op sweep).

The op takes the gradient and the mask and returns the 0-d sum eager's formula gives, run
with eager's kernels: fixed shapes in the graph, eager's bits at every step. Registered
when `remat_ir.torchlib.types` is imported, which every frontend and runtime does
(`frontends/masked_fill_kernels.py` puts it in `masked_fill`'s traced backward).
"""

from __future__ import annotations

import torch

NAME = "remat_ir::masked_fill_value_grad"
OP = "remat_ir.masked_fill_value_grad.default"


@torch.library.custom_op(NAME, mutates_args=())
def masked_fill_value_grad(grad: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The sum of `grad` where `mask` (broadcast alike) is set: eager's formula."""
    return grad.masked_select(mask).sum()


@masked_fill_value_grad.register_fake
def _(grad, mask):
    return grad.new_empty(())


def workspace_bytes(args: list) -> int:
    """Bytes the op may allocate beyond its result, whatever the mask holds. Measured on
    CPU (`runtimes.memory.measure_peak`, float64, float32 and bfloat16): 8 bytes per
    element of the broadcast shape where the mask has the gradient's shape, 16 plus the
    element's where it broadcasts (an attention mask's `[:, None, None, :]`): `masked_select`
    expands and indexes. Declared as the larger, whatever the mask holds, as the
    boolean-mask assignment's is: run on synthetic inputs the mask is whatever they draw
    (`torchlib/masked_assign.workspace_bytes`). A first declaration of 1 byte plus the
    element's let a plan run 66% over its budget (found by a review)."""
    grad, mask = args[0], args[1]
    shape = torch.broadcast_shapes(tuple(grad.shape), tuple(mask.shape))
    return shape.numel() * (grad.element_size() + 16) + 64


#: Its workspace, from its arguments (`types.DECLARED_WORKSPACES`).
WORKSPACES = {OP: workspace_bytes}
