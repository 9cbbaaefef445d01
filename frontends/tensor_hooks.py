"""Gradient hooks put on tensors during the forward: recorded while tracing, then refused.

torch.export records no `Tensor.register_hook`, `retain_grad` or
`register_post_accumulate_grad_hook` called inside the forward: the traced step would
train as if the hook were not there (a hook doubling a hidden state's gradient: every
gradient below it half of eager's, silently, before this check), and a retained
gradient would stay None. `recording_tensor_hooks` notes each such call with the model's
line that made it; the frontend refuses the model, pointing to a
`torch.autograd.Function`, whose backward remat-ir keeps.
"""

from __future__ import annotations

import contextlib
import traceback

import torch

from .model_lines import model_line

#: The Tensor methods that put a gradient hook on a tensor.
METHODS = ("register_hook", "retain_grad", "register_post_accumulate_grad_hook")


@contextlib.contextmanager
def recording_tensor_hooks(calls: list[str]):
    """While the block traces, each gradient hook put on a tensor appends 'Tensor.<method>
    at <model line>' to `calls` (and is put on, as torch would)."""
    originals = {name: getattr(torch.Tensor, name) for name in METHODS}

    def recorded(name, original):
        def method(self, *args, **kwargs):
            calls.append(f"Tensor.{name} at {model_line(traceback.extract_stack()) or 'the model'}")
            return original(self, *args, **kwargs)
        return method

    for name, original in originals.items():
        setattr(torch.Tensor, name, recorded(name, original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
