"""`remat_ir::value_check` and `remat_ir::linalg_check`: checks on tensor values that the
forward makes, run in every step as eager runs them.

Why: eager's `_assert_async(condition, message)` raises when `condition` is false
(on CPU at once, on CUDA as a device-side assert). PyTorch's traced `F.one_hot` makes two
(the classes are not negative, and below `num_classes`), as does a user's
`torch._assert_async`. The op returns nothing, so a graph of values had no place for it
and lowering dropped it: `F.one_hot(labels, 5)` with a label 7 trained on silently with an
all-zero row where eager raises "Class values must be smaller than num_classes".

`value_check` takes the condition and the message, runs `_assert_async` on them (or, for
a branch on values that only raises, `frontends/raising_checks.py`, raises that built-in
exception from Python, as the branch did), and returns an empty tensor. `linalg_check`
does the same for `torch.linalg`'s checked ops, whose check AOTAutograd threads through
an effect token, which lowering drops. The graph hands the empty tensor out as a
`VALUE_CHECK` output: every schedule then runs the check in the forward, and the runtime
drops it. Registered when `remat_ir.torchlib.types` is imported, which every frontend and
runtime does (`frontends/torch.py` puts the ops where a traced forward checks).
"""

from __future__ import annotations

import builtins

import torch

NAME = "remat_ir::value_check"
#: The ops as the IR names them.
OP = "remat_ir.value_check.default"
LINALG_OP = "remat_ir.linalg_check.default"


@torch.library.custom_op(NAME, mutates_args=())
def value_check(condition: torch.Tensor, message: str | None, error: str | None = None) -> torch.Tensor:
    """Eager's `_assert_async(condition, message)` (None: its overload without a message,
    which says "Expected Tensor with single nonzero value, but got zero"); with `error`
    (a built-in exception's name: `frontends/raising_checks.py`), that exception raised
    from Python when `condition` is false, as the `if` or `assert` raised it: it reads
    the value, as eager's branch does, where `_assert_async` on CUDA is a device-side
    assert, which ends the process's use of the device."""
    if error is not None:
        if not bool(condition):
            raise getattr(builtins, error)(message)
    elif message is None:
        torch._assert_async(condition)
    else:
        torch._assert_async(condition, message)
    return condition.new_empty(0)


@value_check.register_fake
def _(condition, message, error=None):
    return condition.new_empty(0)


@torch.library.custom_op("remat_ir::linalg_check", mutates_args=())
def linalg_check(info: torch.Tensor, api_name: str, is_matrix: bool) -> torch.Tensor:
    """Eager's `_linalg_check_errors(info, api_name, is_matrix)`: `torch.linalg`'s checked
    ops (`inv`, `solve`, `cholesky`, ...) run their `_ex` form, then this on its `info`,
    which raises eager's error for a singular or non-positive-definite input. Traced, it is
    an op with an effect, ordered by a token; lowered, it is a check like `value_check`."""
    torch._linalg_check_errors(info, api_name, is_matrix=is_matrix)
    return info.new_empty(0)


@linalg_check.register_fake
def _(info, api_name, is_matrix):
    return info.new_empty(0)
