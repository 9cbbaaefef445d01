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
import os
import traceback

import torch

#: The Tensor methods that put a gradient hook on a tensor.
METHODS = ("register_hook", "retain_grad", "register_post_accumulate_grad_hook")


def _model_line() -> str:
    """'file:line in function' of the innermost frame outside torch and this package."""
    skipped = (os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__)))
    found = "the model"
    for frame in traceback.extract_stack():
        if not os.path.abspath(frame.filename).startswith(skipped):
            found = f"{frame.filename}:{frame.lineno} in {frame.name}"
    return found


@contextlib.contextmanager
def recording_tensor_hooks(calls: list[str]):
    """While the block traces, each gradient hook put on a tensor appends 'Tensor.<method>
    at <model line>' to `calls` (and is put on, as torch would)."""
    originals = {name: getattr(torch.Tensor, name) for name in METHODS}

    def recorded(name, original):
        def method(self, *args, **kwargs):
            calls.append(f"Tensor.{name} at {_model_line()}")
            return original(self, *args, **kwargs)
        return method

    for name, original in originals.items():
        setattr(torch.Tensor, name, recorded(name, original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
