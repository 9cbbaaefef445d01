"""Branches of PyTorch's functions that only raise, traced as checks on values.

Why: `F.gaussian_nll_loss` (and `nn.GaussianNLLLoss`) checks its variance with
`if torch.any(var < 0): raise ValueError(...)`, a branch on tensor data that a trace
cannot take, and no argument turns it off. With a variance the model computes (a
heteroscedastic regression head), lowering refused the model. Eager takes the raising
branch only on bad data; the other branch is the computation. So while tracing, a truth
read at such a site is answered False (the computing branch), and the condition is traced
as a `remat_ir.value_check` that raises eager's exception with eager's message at every
step (`torchlib/value_checks.py`).

Only the sites listed in `SITES` are answered so: elsewhere a branch may compute, and
which side raises is not known.
"""

from __future__ import annotations

import sys

import torch

#: (file of PyTorch, function) -> (the exception eager raises, its message), where the
#: function's one truth read on tensor data guards that raise.
SITES = {
    ("torch/nn/functional.py", "gaussian_nll_loss"): ("ValueError", "var has negative entry/entries"),
}

#: Files of remat-ir between a truth read and the code that reads it.
_OURS = ("input_branches.py", "raising_checks.py")


def raising_branch(tensor: torch.Tensor) -> bool | None:
    """False, with `tensor`'s truth traced as a check, where the code reading it is one of
    `SITES`; else None (not decided here)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.endswith(_OURS):
        frame = frame.f_back
    if frame is None:
        return None
    file = frame.f_code.co_filename.replace("\\", "/")
    site = next((raised for (where, function), raised in SITES.items()
                 if file.endswith(where) and frame.f_code.co_name == function), None)
    if site is None:
        return None
    error, message = site
    torch.ops.remat_ir.value_check(torch.logical_not(tensor), message, error)
    return False
