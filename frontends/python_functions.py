"""Functions written in Python with torch's override prologue, traced under every mode.

Every `torch.nn.functional` function written in Python, many `Tensor` methods and user
helpers written the same way begin with torch's override prologue
(`if has_torch_function_variadic(x): return handle_torch_function(f, (x,), x)`). While
torch-function modes are active, that prologue hands the call to the top mode with the
mode popped; a mode that passes it on calls the function again, whose prologue hands it
to the next mode, and the body finally runs with every mode popped. So what the modes do
while the forward is exported was skipped inside such bodies:
- torch.export's pre-dispatch mode records `torch.no_grad()` blocks: the in-place clamp
  `F.gaussian_nll_loss` makes under `no_grad` was differentiated, and the variance head's
  gradients were 0.165 off eager's under every schedule (hunt76 F4);
- remat-ir's own modes (overlapping writes refused, kernels chosen as eager's...) never
  saw the ops: an overlapping shift in a helper written this way trained 0.44 off (F5).

`python_bodies_traced` (around torch.export's trace, above remat-ir's own modes) pushes a
mode that such a call reaches after the modes above it have passed it on. It puts those modes back, found in the `handle_torch_function` frames
that popped them, and runs the function with its prologue's next check skipped
(`torch.overrides.redispatch_function`), so its body runs under every mode, as the
forward's own code does. Where the frames are not that plain chain (a mode that called
the function from elsewhere, a function wrapped otherwise), the call goes on as torch
runs it."""

from __future__ import annotations

import contextlib
import inspect
import sys

import torch
from torch.overrides import TorchFunctionMode, handle_torch_function, redispatch_function

_HANDLE = handle_torch_function.__code__
_TENSOR_HANDLER = torch.Tensor.__torch_function__.__func__


def _plain(kind: type) -> bool:
    """Whether arguments of type `kind` take torch's own `__torch_function__` (a subclass
    with one of its own keeps seeing the call as torch hands it over)."""
    handler = getattr(kind, "__torch_function__", None)
    return getattr(handler, "__func__", handler) in (_TENSOR_HANDLER, torch._C._disabled_torch_function_impl)


def _plain_function(func) -> bool:
    """A Python function (or a module's method: `handle_torch_function(self.clamped, ...)`)
    whose call runs its body: not a generator's or a coroutine's, whose call returns before
    the body, and its prologue, run (hunt82: a generator with the prologue recursed without
    end)."""
    func = getattr(func, "__func__", func) if inspect.ismethod(func) else func
    return inspect.isfunction(func) and not (
        func.__code__.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR))


def _handing_over(frame, func) -> bool:
    """Whether `frame` is `handle_torch_function` handing `func` to a mode (a method bound
    anew at each level compares equal)."""
    if frame is None or frame.f_code is not _HANDLE:
        return False
    api = frame.f_locals.get("public_api")
    return api is func or (inspect.ismethod(func) and api == func)


def _codes(func) -> set:
    """The code of `func` and of the functions it wraps (`functools.wraps`' `__wrapped__`):
    a decorated helper's prologue runs in the function its wrapper calls (hunt82)."""
    codes, seen = set(), 0
    func = func.__func__ if inspect.ismethod(func) else func
    while func is not None and seen < 8:
        if (code := getattr(func, "__code__", None)) is not None:
            codes.add(code)
        func, seen = getattr(func, "__wrapped__", None), seen + 1
    return codes


def _popped_on_the_way(func, frame) -> list | None:
    """The modes popped on the way of this call of `func` to the mode called from `frame`
    (a `handle_torch_function` frame), lowest first, or None where the frames are not a
    plain chain of modes passing the call on."""
    modes, codes = [], _codes(func)
    while True:
        if not _handing_over(frame, func):
            return None
        modes.append(frame.f_locals.get("mode"))
        prologue = frame.f_back   # the function's own frame, whose prologue handed it over
        if prologue is None or prologue.f_code not in codes:
            return None
        while prologue.f_back is not None and prologue.f_back.f_code in codes:   # its decorators'
            prologue = prologue.f_back
        passing = prologue.f_back   # a mode's __torch_function__ passing it on, or the caller
        above = passing.f_back if passing is not None else None
        if not (_handing_over(above, func) and passing.f_locals.get("self") is above.f_locals.get("mode")):
            return modes
        frame = above


def _tracing(mode) -> bool:
    """Whether `mode` is one tracing put on (torch.export's, remat-ir's): only those are put
    back for a body. Eager runs the body with every mode above popped, a user's mode
    entered in the forward (diffusers' attention-skipping mode) and `torch.device(...)`'s
    too: put back, a user's mode changed the body's ops (hunt82: F.normalize under a mode
    changing `norm`, 0.72 off eager's)."""
    module = type(mode).__module__
    return module in _TRACING_MODULES or module.startswith(_OWN)


#: The modules of torch.export's torch-function modes (its non-strict handler, the
#: pre-dispatch tracer's modes that record `no_grad` and autocast blocks).
_TRACING_MODULES = frozenset({"torch._export.non_strict_utils", "torch.fx.experimental.proxy_tensor"})
#: remat-ir's own modes (this one; those a traced custom Function's backward runs under).
_OWN = __name__.rsplit(".", 1)[0] + "."


class _PythonBodies(TorchFunctionMode):
    """Runs the body of a Python function that reached it under the modes popped on its
    way (module docstring)."""

    def __init__(self):
        super().__init__()
        self.running: list[tuple] = []   # (function, arguments) whose body this mode runs now

    def _again(self, func, args) -> bool:
        """Whether this call is one this mode is running already (the function handed
        itself over again, its prologue not the one `redispatch_function` skips)."""
        return any((f is func or (inspect.ismethod(func) and f == func)) and len(a) == len(args)
                   and all(x is y for x, y in zip(a, args)) for f, a in self.running)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not _plain_function(func) or not all(map(_plain, types)) or self._again(func, args):
            return func(*args, **kwargs)
        popped = _popped_on_the_way(func, sys._getframe(1))
        if not popped or not all(isinstance(mode, TorchFunctionMode) for mode in popped):
            return func(*args, **kwargs)
        popped = [mode for mode in popped if _tracing(mode)]
        for mode in popped:
            torch._C._push_on_torch_function_stack(mode)
        self.running.append((func, args))
        try:
            return redispatch_function(func, types, args, kwargs)
        finally:
            self.running.pop()
            for _ in popped:
                torch._C._pop_torch_function_stack()


@contextlib.contextmanager
def python_bodies_traced():
    """Within: a Python function with torch's override prologue runs its body under the
    torch-function modes active at its call (module docstring)."""
    with _PythonBodies():
        yield
