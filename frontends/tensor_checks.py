"""`torch._check_tensor_all` on traced tensors, traced as a check run at every step.

Why: `torch._check_tensor_all(cond, message)` (and `torch._check_tensor_all_with(error,
cond, message)`, which transformers' `torch_compilable_check` calls in eager) is
PyTorch's way to check a tensor condition: eager reads `cond`'s value and raises when an
element is false. A trace cannot read the value, so on what the forward computes
(`torch._check_tensor_all(h.isfinite())`) lowering refused the model, and on the
inputs' values alone it took the answer as a branch of the call (`input_branches.py`),
so a failing call was planned again, to be refused there with a `LoweringError` instead
of eager's error.

So while tracing, a call on a traced tensor becomes a `remat_ir.value_check`
(`torchlib/value_checks.py`) raising eager's exception type with eager's message at every
step: the message callable's text where it reads no tensor value, PyTorch's default
message without one; a message computed from tensor values (an f-string of a count)
cannot be, and the check names where it is instead. An exception type that is not a
built-in one (a user's class) is refused by name. Like any value check it raises where
the schedule runs it in the forward (`raising_checks.py` says what that means).
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import sys
import traceback

import torch
from torch._subclasses.fake_tensor import is_fake
from torch.overrides import TorchFunctionMode

from .errors import LoweringError
from .model_lines import model_line
from .transformers_paths import swapped_globals

#: PyTorch's message for a check called without one (`torch._check_with`).
DEFAULT_MESSAGE = ("Expected cond to be True, but got False. (Could this error message be "
                   "improved? If so, please report an enhancement request to PyTorch.)")


@contextlib.contextmanager
def tensor_checks_as_value_checks(model: str):
    """Within: `torch._check_tensor_all_with` (hence `torch._check_tensor_all`) on a traced
    tensor traces a value check; on a tensor with values it runs as eager's."""
    original = torch._check_tensor_all_with

    def checked(error_type, cond, message=None):
        # A tensor with values, or not a boolean tensor (eager's argument check raises
        # before any value is read): as eager.
        if not isinstance(cond, torch.Tensor) or not is_fake(cond) or cond.dtype != torch.bool:
            return original(error_type, cond, message)
        where = model_line(traceback.extract_stack()[:-1]) or "a line tracing did not record"
        name = getattr(error_type, "__name__", None)
        if getattr(builtins, name or "", None) is not error_type:
            raise LoweringError(
                f"{model}'s forward checks a tensor condition at {where} with "
                f"torch._check_tensor_all_with({getattr(error_type, '__qualname__', error_type)}, ...): "
                f"remat-ir runs such a check at every step, raising a built-in exception; "
                f"pass one (ValueError, RuntimeError, ...) or check outside the module")
        if message is not None and not callable(message):   # eager's error once it fails
            error, text = "TypeError", "message must be a callable"
        else:
            error, text = name, _message(message)
        if text is None:
            text = (f"{model}'s check on tensor values at {where} failed (eager's message "
                    f"is computed from tensor values)")
        torch.ops.remat_ir.value_check(cond.all(), text, error)

    torch._check_tensor_all_with = checked
    try:
        with _transformers_checks_as_eager():
            yield
    finally:
        torch._check_tensor_all_with = original


@contextlib.contextmanager
def _transformers_checks_as_eager():
    """Within: transformers' `torch_compilable_check` takes eager's path. While tracing it
    calls `torch._check_tensor_all(cond)`, without the model's message and raising
    RuntimeError where eager raises `error_type` (ValueError) with it."""
    import_utils = sys.modules.get("transformers.utils.import_utils")
    if getattr(import_utils, "torch_compilable_check", None) is None:
        yield
        return

    def as_eager(name, original):
        @functools.wraps(original)
        def check(*args, **kwargs):
            tracing = import_utils.is_tracing
            import_utils.is_tracing = lambda *_, **__: False
            try:
                return original(*args, **kwargs)
            finally:
                import_utils.is_tracing = tracing
        return check

    with swapped_globals("transformers.", ("torch_compilable_check",), as_eager):
        yield


def _message(message) -> str | None:
    """Eager's message, or None where it reads a traced tensor's value."""
    if message is None:
        return DEFAULT_MESSAGE
    try:
        # Eager calls it only once the check failed: what it computes must enter neither
        # the graph nor the decisions on the inputs, so any tensor op in it stops it.
        with _NoTensorOps():
            text = str(message())
    except Exception:   # a value read of a traced tensor (an f-string of a count)
        return None
    return None if "Tensor(" in text else text


class _NoTensorOps(TorchFunctionMode):
    """Within: any torch function (an op, a tensor method, formatting a tensor) raises."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        raise RuntimeError(f"a message computed from tensors ({func})")
