"""TorchScript functions (`@torch.jit.script` on a function) called by a forward, traced
as the Python functions they were made from.

Called while tracing, a scripted function runs in TorchScript's graph executor, which,
once warmed up (two calls, in eager steps before `remat` or in lowering's own traces),
runs a differentiable graph of its own: tracing saw its ops without their autograd
history, and every gradient upstream of the call was lost, silently (found by a review:
the first layer's `.grad` stayed None, and a plan made for a new shape, after lowering had
warmed the executor, lost it too). While tracing, `ScriptFunction.__call__` runs the
Python original that `torch.jit.script` keeps (`_torchdynamo_inline`, which torch.compile
inlines too), whose ops are traced as any, with `torch.jit.is_scripting()` answering True
as it does in the compiled function (a branch on it took the Python path: a loss 35.9 off
eager's, found by a review). Their gradients are aten's formulas; eager's executor, warmed
up after a function's first calls (two calls in one forward suffice), differentiates with
TorchScript's own, which may round otherwise (a tanh's: 2.4e-7), and a warning says so
once per function. A scripted function without its Python original (compiled from a
string) is refused by name, and so is a function `torch.jit.trace` made: its graph fixed
the control flow, shapes and globals it was traced with, and with this hook in place
torch.export traced its Python source (kept for torch.compile) even where the hook called
the function's own `__call__` (a review found losses 26.4 and 997 off eager's, silently;
without the hook it ran its graph).
Left: a global function that a scripted function calls, rebound after scripting, is the
new one here where the compiled function keeps the old (the warning says so).
TorchScript modules are refused apart (`refusals.check_script_modules`).
"""

from __future__ import annotations

import contextlib
import sys
import warnings

import torch

from .errors import LoweringError

#: The functions warned about, once per process.
_WARNED: set[str] = set()


#: The code of the scripted functions whose Python originals run now.
_RUNNING: list = []


def _scripting() -> bool:
    """`torch.jit.is_scripting()`: True where a scripted function's Python original asks,
    False elsewhere (torch's own functions ask it too, to skip `__torch_function__`)."""
    return sys._getframe(1).f_code in _RUNNING


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
        if getattr(function, "__name__", None) != "ScriptFunction":   # `torch.jit.trace`'s
            raise LoweringError(
                f"the forward calls {function.qualified_name}, a function torch.jit.trace made: its "
                f"graph fixed the control flow, shapes and globals of the call it was traced with, "
                f"which tracing here computes again from its Python source; call the Python "
                f"function instead (or torch.jit.script it)")
        if function.qualified_name not in _WARNED:
            _WARNED.add(function.qualified_name)
            warnings.warn(
                f"remat-ir traces TorchScript function {function.qualified_name} as its Python "
                f"source (torch.jit.is_scripting() True); eager's TorchScript executor, warmed up "
                f"after the function's first calls, differentiates it by TorchScript's own "
                f"formulas, whose last bits may differ, and keeps the global functions it calls "
                f"as they were when it was scripted", stacklevel=2)
        scripting = torch.jit.is_scripting
        torch.jit.is_scripting = _scripting
        _RUNNING.append(python.__code__)
        try:
            return python(*args, **kwargs)
        finally:
            _RUNNING.pop()
            torch.jit.is_scripting = scripting

    torch.jit.ScriptFunction.__call__ = call
    try:
        yield
    finally:
        torch.jit.ScriptFunction.__call__ = original
