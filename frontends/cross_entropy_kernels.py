"""`cross_entropy` with class weights and label smoothing traced as eager computes it.

Why: with `weight=`, `label_smoothing > 0` and the mean, ATen's composite normalises the
smoothing term by the summed weights of the targets it does not ignore. For plain tensors
it sums them compacted (`weight.gather(0, target.masked_select(~ignored)).sum()`); for a
tensor subclass (what tracing runs on) it sums every target's weight with the ignored ones
zeroed (`masked_fill_(ignored, 0).sum()`): a sum of other length, other bits. A batch with
an ignored target (padding, `-100`) trained up to 2.4e-7 off eager's loss and gradients,
under every schedule (hunt76 F7).

So while tracing, `aten.cross_entropy_loss` with those three runs `cross_entropy_loss`
below: ATen's label-smoothing path op for op, its weight sum taken by
`remat_ir::masked_fill_value_grad`, which sums the selected elements as eager's
`masked_select(...).sum()` does (fixed shapes in the graph, eager's bits at each step).
Every other call runs ATen's composite, as does a weight that needs a gradient (the sum's
op has no backward).
"""

from __future__ import annotations

import torch
from torch._C import DispatchKey

from remat_ir.torchlib.masked_fill_grads import masked_fill_value_grad

aten = torch.ops.aten
_MEAN = 1   # ATen's Reduction::Mean


def cross_entropy_loss(input: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                       reduction: int = _MEAN, ignore_index: int = -100,
                       label_smoothing: float = 0.0) -> torch.Tensor:
    """ATen's `cross_entropy_loss`; with class weights, label smoothing and the mean over
    class-index targets, its plain-tensor path op for op (module docstring)."""
    if (weight is None or label_smoothing <= 0.0 or reduction != _MEAN or weight.requires_grad
            or target.is_floating_point() or input.shape == target.shape or label_smoothing > 1.0):
        return aten.cross_entropy_loss.default._op_dk(
            DispatchKey.CompositeImplicitAutograd, input, target, weight, reduction, ignore_index, label_smoothing)
    class_dim = 0 if input.dim() == 1 else 1
    log_probs = aten._log_softmax(input, class_dim, False)
    nll = aten.nll_loss_nd(log_probs, target, weight, reduction, ignore_index)
    ignored = aten.eq(target, ignore_index)
    shape = [1] * log_probs.dim()
    shape[class_dim] = weight.shape[0]
    smooth = aten.neg(aten.sum(aten.mul(log_probs, aten.view(weight, shape)), [class_dim]))
    smooth = aten.masked_fill(smooth, ignored, 0.0)
    targets_weights = aten.gather(weight, 0, aten.flatten(aten.masked_fill(target, ignored, 0)))
    weight_sum = masked_fill_value_grad(targets_weights, aten.flatten(aten.bitwise_not(ignored)))
    smooth_mean = aten.div(aten.sum(smooth), weight_sum)
    return aten.add(aten.mul(nll, 1 - label_smoothing), aten.mul(smooth_mean, label_smoothing / input.shape[class_dim]))


#: Op -> the Python kernel AOTAutograd's tracing runs for it (under `KEY`); the exported
#: program keeps `cross_entropy_loss` whole.
KERNELS = {aten.cross_entropy_loss.default: cross_entropy_loss}
KEY = DispatchKey.CompositeImplicitAutograd
