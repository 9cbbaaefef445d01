"""`remat_ir::ctc_loss`: the CTC loss as one op of fixed shapes, run with eager's kernels
forward and backward.

Why: eager's `torch.ctc_loss` runs `_ctc_loss`, whose second result (the forward
variables alpha, kept for the backward) has `2 * max(target_lengths) + 1` columns: a
shape read from the target lengths' values. Traced, the step had no fixed shape there
and every model computing a CTC loss in its forward was refused: the speech models of
transformers fine-tuned for recognition (wav2vec2, HuBERT, WavLM, ... `ForCTC`), whose
loss also takes the targets out of the padded labels with `masked_select`, a tensor of
as many elements as the labels' mask has set.

The op takes what `torch.ctc_loss` takes, plus an optional mask: with one, the targets
are `targets.masked_select(mask)`, taken inside the op (`frontends/ctc_losses.py` folds
a `masked_select` that only feeds the loss into it). Its result is the loss: a scalar
or one value per sequence, fixed shapes either way. Its backward is a second op that
runs the loss again under autograd and asks autograd for the gradient of the log
probabilities: `_ctc_loss` and its backward, the `where` of `zero_infinity`, the
division and mean of the reduction, the very kernels eager's backward runs on the same
tensors, so the gradient has eager's bits. The cost: the forward variables are computed
twice (once per op) instead of kept from the forward to the backward, an O(T x S) pass
per sequence, small beside the network; and the backward holds them only while it
runs. They are each op's workspace (`workspace_bytes`), bounded by the longest target
the shapes allow: profiling runs ops on synthetic inputs, whose zero lengths would
measure none. Eager's choice of cuDNN's CTC (on CUDA, for int32 targets on the CPU) follows
`torch.backends.cudnn.enabled` where the forward called the loss (transformers turns it
off there), which the op is given. Registered when `remat_ir.torchlib.types` is
imported, which every frontend and runtime does.
"""

from __future__ import annotations

import contextlib
import functools

import torch

NAME = "remat_ir::ctc_loss"
#: The ops as the IR names them.
OP = "remat_ir.ctc_loss.default"
BACKWARD_OP = "remat_ir.ctc_loss_backward.default"
#: Bytes the ops allocate beyond alpha (and beta) and the targets: per sequence (its
#: lengths as int64, its loss), and once (the reduction's scalars); measured on CPU
#: at most 2 x 8 x B + 150 over them, rounded up for an allocator's granularity.
PER_SEQUENCE_BYTES, FIXED_BYTES = 64, 4096


@contextlib.contextmanager
def _cudnn(enabled: bool):
    """Within: `torch.backends.cudnn.enabled` as the forward had it at the loss (only that
    flag: `torch.backends.cudnn.flags` would set the others to its defaults)."""
    # torch's own setter, as `flags()` uses: after `torch.backends.disable_global_flags()`
    # (which `torch.testing`'s utilities call) setting the attribute raises, where eager's
    # CTC loss runs (found by a review).
    before = torch._C._get_cudnn_enabled()
    torch._C._set_cudnn_enabled(enabled)
    try:
        yield
    finally:
        torch._C._set_cudnn_enabled(before)


def _loss(log_probs, targets, mask, input_lengths, target_lengths, input_list, target_list,
          blank, reduction, zero_infinity, cudnn):
    """Eager's `torch.ctc_loss` on the op's arguments: lengths given as tensors take its
    tensor overload, as lists its list one, as the forward called it."""
    if mask is not None:
        targets = targets.masked_select(mask)
    lengths = (input_lengths, target_lengths) if input_lengths is not None else (input_list, target_list)
    with _cudnn(cudnn):
        return torch.ctc_loss(log_probs, targets, *lengths, blank, reduction, zero_infinity)


@torch.library.custom_op(NAME, mutates_args=())
def ctc_loss(log_probs: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None,
             input_lengths: torch.Tensor | None, target_lengths: torch.Tensor | None,
             input_list: list[int], target_list: list[int], blank: int, reduction: int,
             zero_infinity: bool, cudnn: bool) -> torch.Tensor:
    """`torch.ctc_loss(log_probs, targets[, masked by mask], lengths, blank, reduction,
    zero_infinity)` (reduction as ATen numbers it: 0 none, 1 mean, 2 sum); the lengths are
    the tensors, or where those are None the lists."""
    return _loss(log_probs, targets, mask, input_lengths, target_lengths, input_list, target_list,
                 blank, reduction, zero_infinity, cudnn)


@ctc_loss.register_fake
def _(log_probs, targets, mask, input_lengths, target_lengths, input_list, target_list,
      blank, reduction, zero_infinity, cudnn):
    if reduction:
        return log_probs.new_empty(())
    return log_probs.new_empty(log_probs.shape[1:2] if log_probs.dim() == 3 else ())


@torch.library.custom_op(f"{NAME}_backward", mutates_args=())
def ctc_loss_backward(grad: torch.Tensor, log_probs: torch.Tensor, targets: torch.Tensor,
                      mask: torch.Tensor | None, input_lengths: torch.Tensor | None,
                      target_lengths: torch.Tensor | None, input_list: list[int],
                      target_list: list[int], blank: int, reduction: int, zero_infinity: bool,
                      cudnn: bool) -> torch.Tensor:
    """The gradient of the log probabilities, as eager's backward of the loss computes it
    from `grad`: the loss run again under autograd and differentiated by it."""
    with _autograd_on():
        leaf = log_probs.detach().requires_grad_()
        loss = _loss(leaf, targets, mask, input_lengths, target_lengths, input_list, target_list,
                     blank, reduction, zero_infinity, cudnn)
        (found,) = torch.autograd.grad(loss, leaf, grad)
    return found


@contextlib.contextmanager
def _autograd_on():
    """Within: autograd records, inside an op's body. An op runs below autograd (its
    dispatch keys excluded), where `torch.enable_grad()` alone records nothing, and
    `torch.func.vjp`, which records there, fails on `torch.ctc_loss`'s overload taking
    lengths as lists (it makes a tensor of them inside the transform)."""
    from torch._C import DispatchKey

    excluded = torch._C._dispatch_tls_local_exclude_set().remove(DispatchKey.AutogradFunctionality)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), excluded), \
            torch.enable_grad():
        yield


@ctc_loss_backward.register_fake
def _(grad, log_probs, *rest):
    # `_ctc_loss_backward` and cuDNN's gradient are contiguous, whatever the strides of the
    # log probabilities (usually a transposed view of a log-softmax).
    return log_probs.new_empty(log_probs.shape)


def _setup(ctx, inputs, output):
    log_probs, targets, mask, input_lengths, target_lengths = inputs[:5]
    ctx.save_for_backward(log_probs, targets, mask, input_lengths, target_lengths)
    ctx.rest = inputs[5:]


def _backward(ctx, grad):
    log_probs, targets, mask, input_lengths, target_lengths = ctx.saved_tensors
    found = ctc_loss_backward(grad, log_probs, targets, mask, input_lengths, target_lengths, *ctx.rest)
    return (found,) + (None,) * 10


ctc_loss.register_autograd(_backward, setup_context=_setup)


def workspace_bytes(op: str, args: list) -> int:
    """Bytes `op` (`OP` or `BACKWARD_OP`: `WORKSPACES`), called on `args` (tensors of any
    device, meta included, for tensor arguments), may allocate beyond its result: the forward
    variables alpha, `2 S + 1` per frame and sequence with S the longest target the
    shapes allow (a row of padded labels, or all the targets given concatenated), beta
    beside them in the backward, and the targets selected (in their dtype) and made
    int64. Measured on CPU (T 10-400, B 3-8, S 4-60, int64 labels): 700 bytes or more
    under this bound."""
    log_probs, targets = args[:2] if op == OP else args[1:3]
    sequences = log_probs.shape[1] if log_probs.dim() == 3 else 1
    longest = targets.shape[-1] if targets.dim() == 2 else targets.numel()
    alpha = sequences * log_probs.shape[0] * (2 * longest + 1) * log_probs.element_size()
    selected = targets.numel() * (targets.element_size() + torch.int64.itemsize)
    return ((2 if op == BACKWARD_OP else 1) * alpha + selected + sequences * PER_SEQUENCE_BYTES
            + FIXED_BYTES)


#: Both ops' workspaces, from their arguments (`types.DECLARED_WORKSPACES`).
WORKSPACES = {op: functools.partial(workspace_bytes, op) for op in (OP, BACKWARD_OP)}
