"""Random calls that tracing cannot take as written, traced with eager's draws.

`x.random_(low, high)`: torch.export (torch 2.13) records it as `aten.random_.from` and
writes the op's name into Python source, where `from` is a keyword: the trace failed
with "invalid syntax" inside torch, naming nothing of the model (a 2026-11 bad-input
sweep found it). While tracing, such a call runs as `x.random_(high - low)` then, for a
nonzero `low`, `x.add_(low)`. ATen draws both overloads with one kernel (`low + draw %
range`, and `random_(to)` is `low = 0`), so the generator moves alike and, where the add
is exact, the values are eager's: a zero `low` (no add), integer dtypes, and floating
ones in which every integer up to max(|low|, |high|) is exact (2**24 for float32, 2**8
for bfloat16). Checked bitwise, values and generator state, for eight dtypes and a
transposed tensor (`tests/test_rng.py`). Elsewhere (a bound beyond that, `high=None`)
the call is refused naming its line, with what to write instead.

`torch.randint_like(t, ...)` of a `t` that needs a gradient: eager's result needs none
(a factory reads only `t`'s shape, dtype and layout), but AOTAutograd gave it a gradient
function that does not exist ("derivative for aten::randint_like is not implemented"),
and the model was refused. While tracing, it reads `t.detach()`: the same draws.
"""

from __future__ import annotations

import contextlib
import traceback

import torch

from .errors import LoweringError
from .model_lines import model_line


def _exact_up_to(dtype: torch.dtype) -> int | None:
    """The largest bound below which every integer is exact in `dtype` (2 / eps: 2**24 for
    float32); None for integer dtypes, where every sum in range is."""
    return int(2 / torch.finfo(dtype).eps) if dtype.is_floating_point else None


def _caller() -> str:
    """'file:line in function' of the model's call."""
    return model_line(traceback.extract_stack()) or "a line of the model"


@contextlib.contextmanager
def drawing_as_eager():
    """While the block traces, `Tensor.random_(low, high)` and `torch.randint_like` draw
    as the module docstring says; both are put back on exit."""
    original, randint_like = torch.Tensor.random_, torch.randint_like

    def randint_like_detached(input, *args, **kwargs):
        return randint_like(input.detach(), *args, **kwargs)

    def random_(self, *args, **kwargs):
        bounded = len(args) == 2 or "from" in kwargs
        if not bounded:
            return original(self, *args, **kwargs)
        low = args[0] if args else kwargs.pop("from")
        high = args[1] if len(args) == 2 else kwargs.pop("to", None)
        if high is not None and high <= low:   # the trace checks no bounds: eager's error
            raise LoweringError(f"`Tensor.random_({low}, {high})` at {_caller()}: random_ expects "
                                f"'from' to be less than 'to' (eager raises it too)")
        limit = _exact_up_to(self.dtype)
        if high is None or (low and limit is not None and max(abs(low), abs(high)) > limit):
            raise LoweringError(
                f"`Tensor.random_({low}, {high})` at {_caller()}: torch.export cannot trace "
                f"random_ with a lower bound (it writes the op `aten.random_.from` as Python "
                f"code, where `from` is a keyword), and remat-ir draws it as `random_(high - "
                f"low)` plus low only where that sum is exact in {self.dtype}: draw in an "
                f"integer dtype and convert, or use torch.randint(low, high, size)")
        original(self, high - low, **kwargs)
        return self.add_(low) if low else self

    torch.Tensor.random_, torch.randint_like = random_, randint_like_detached
    try:
        yield
    finally:
        torch.Tensor.random_, torch.randint_like = original, randint_like
