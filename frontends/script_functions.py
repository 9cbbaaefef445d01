"""TorchScript functions (`@torch.jit.script` on a function) called by a forward, traced
as the Python functions they were made from.

Called while tracing, a scripted function runs in TorchScript's graph executor, which,
once warmed up (two calls, in eager steps before `remat` or in lowering's own traces),
runs a differentiable graph of its own: tracing saw its ops without their autograd
history, and every gradient upstream of the call was lost, silently (found by a review:
the first layer's `.grad` stayed None, and a plan made for a new shape, after lowering had
warmed the executor, lost it too). While tracing, `ScriptFunction.__call__` runs the
Python original that `torch.jit.script` keeps (`_torchdynamo_inline`, which torch.compile
inlines too), whose ops are traced as any. Their gradients are aten's formulas; eager's
warmed-up executor differentiates with TorchScript's own, which may round otherwise (a
tanh's: 2.4e-7), and a warning says so once per function. A scripted function without
its Python original (compiled from a string) is refused by name.
TorchScript modules are refused apart (`refusals.check_script_modules`).
"""

from __future__ import annotations

import contextlib
import warnings

import torch

from .errors import LoweringError

#: The functions warned about, once per process.
_WARNED: set[str] = set()


@contextlib.contextmanager
def script_functions_as_python():
    """Within: a call of a TorchScript function runs its Python original (module docstring)."""
    original = torch.jit.ScriptFunction.__call__

    def call(function, *args, **kwargs):
        python = getattr(function, "_torchdynamo_inline", None)
        if python is None:
            raise LoweringError(
                f"the forward calls TorchScript function {function.qualified_name}, which has no "
                f"Python source to trace (compiled from a string, or loaded), and whose gradients "
                f"tracing through TorchScript's executor loses; call a Python function instead")
        if function.qualified_name not in _WARNED:
            _WARNED.add(function.qualified_name)
            warnings.warn(
                f"remat-ir traces TorchScript function {function.qualified_name} as its Python "
                f"source; eager's TorchScript executor, once warmed up, differentiates it by "
                f"TorchScript's own formulas, whose last bits may differ", stacklevel=2)
        return python(*args, **kwargs)

    torch.jit.ScriptFunction.__call__ = call
    try:
        yield
    finally:
        torch.jit.ScriptFunction.__call__ = original
