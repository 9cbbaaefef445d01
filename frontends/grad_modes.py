"""`torch.inference_mode` inside a forward, traced as the `no_grad` it means for training.

torch.export keeps `no_grad` and `enable_grad` regions in its program, but drops
`inference_mode` (torch 2.13, strict and not): its region was traced as ordinary code, and
the joint graph differentiated through it. A target computed under inference mode
(`with torch.inference_mode(): target = teacher(x)`) then trained the teacher, which eager
leaves without a gradient: a silent error (2026-11-30). For gradients the two modes are
the same thing: `InferenceMode(mode)` sets grad mode to `not mode` besides its own
bookkeeping (inference tensors, no version counters), which a traced graph has no use for.
While tracing, the guard behind every form of it (`with`, decorator, the functional
`_enter_inference_mode`) sets grad mode so and puts it back on leaving, as
`set_grad_enabled` does; export records that.
"""

from __future__ import annotations

import contextlib

import torch


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
