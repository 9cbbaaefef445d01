"""Autograd contexts a forward enters that torch.export drops (torch 2.13, strict and not):
`torch.inference_mode`, traced as the `no_grad` it means for gradients, and saved-tensor
hooks, refused unless they keep values exactly.

`inference_mode`: its region was traced as ordinary code, and the joint graph
differentiated through it. A target computed under it (`with torch.inference_mode():
target = teacher(x)`) then trained the teacher, which eager leaves without a gradient:
a silent error (2026-11-30). For gradients the two modes are the same thing:
`InferenceMode(mode)` sets grad mode to `not mode` besides its own bookkeeping (inference
tensors, no version counters), which a traced graph has no use for. While tracing, the
guard behind every form of it (`with`, decorator, the functional `_enter_inference_mode`)
sets grad mode so and puts it back on leaving, as `set_grad_enabled` does; export
records that.

Saved-tensor hooks (`torch.autograd.graph.saved_tensors_hooks`) set in the forward: the
graph keeps no trace of them (`torchlib.saved_hooks`), so a pack hook that casts what it
keeps gave gradients other than eager's, silently. The places the model's code enters
them are noted while tracing, for the frontend to refuse them or, for `save_on_cpu`, to
say that it moves nothing.
"""

from __future__ import annotations

import contextlib
import sys

import torch

from remat_ir.torchlib.saved_hooks import is_save_on_cpu

from .model_lines import is_model_file


class _GradModeOfInferenceMode:
    """`torch._C._InferenceMode(mode)`'s effect on gradients alone."""

    def __init__(self, mode: bool = True) -> None:
        self.mode = mode

    def __enter__(self) -> None:
        self.before = torch.is_grad_enabled()
        torch._C._set_grad_enabled(not self.mode)

    def __exit__(self, *exc) -> None:
        torch._C._set_grad_enabled(self.before)


@contextlib.contextmanager
def inference_mode_as_grad_mode():
    """While the block runs, `torch.inference_mode(mode)` is `torch.set_grad_enabled(not mode)`."""
    guard = torch._C._InferenceMode
    torch._C._InferenceMode = _GradModeOfInferenceMode
    try:
        yield
    finally:
        torch._C._InferenceMode = guard


@contextlib.contextmanager
def noting_saved_tensor_hooks(found: list[tuple[str, bool]]):
    """While the block runs, append ('file:line', keeps values exactly) to `found` where the
    model's code (or a library's, not torch's) enters saved-tensor hooks."""
    hooks = torch.autograd.graph.saved_tensors_hooks
    enter = hooks.__enter__

    def entered(self) -> None:
        caller = sys._getframe(1)
        if is_model_file(caller.f_code.co_filename):
            found.append((f"{caller.f_code.co_filename}:{caller.f_lineno}", is_save_on_cpu(self.pack_hook)))
        enter(self)

    hooks.__enter__ = entered
    try:
        yield
    finally:
        hooks.__enter__ = enter
