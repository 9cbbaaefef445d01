"""`remat_ir::draw_in_layout`: a random fill drawn in the memory layout eager draws in.

Why: eager's in-place random ops draw into the tensor they are given, in its layout.
`h.t().bernoulli_(0.5)` fills the transposed view in memory order (on CPUs whose
kernel is the serial one), and `h[:, :8].normal_()` on a view that is not contiguous
takes the serial Box-Muller path, not the vectorised one: other numbers, and the
generator left elsewhere. Tracing turns an in-place op into its functional form
(`bernoulli.p`, `normal_functional`), which draws into a fresh contiguous tensor, in
logical order: a step with such a view trained with other masks and noise than eager,
silently, under every schedule (2026-11-29 sweep: outputs 1.3 off). Which order a
kernel uses depends on the machine (Intel's MKL Bernoulli draws a contiguous copy), so
the op does not model it: it runs the same in-place kernel on a tensor of the same
strides, and returns the values contiguous.

The frontend (`frontends/inplace_draws.py`) puts it where an in-place random fill meets
a tensor that is not contiguous. Its draws depend only on the shape, strides, dtype and
arguments (a `rng_shape_only` op for the runtime's RNG replay). The op is registered
when `remat_ir.torchlib.types` is imported, which every frontend and runtime does.
"""

from __future__ import annotations

import torch

#: The in-place fills the op runs, by method name: eager's Tensor methods of these names.
METHODS = ("bernoulli_", "normal_", "uniform_", "exponential_", "cauchy_", "log_normal_",
           "geometric_", "random_")

NAME = "remat_ir::draw_in_layout"


def _strided_like(like: torch.Tensor, stride: list[int]) -> torch.Tensor:
    return torch.empty_strided(like.shape, stride, dtype=like.dtype, device=like.device)


@torch.library.custom_op(NAME, mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def draw_in_layout(like: torch.Tensor, stride: list[int], method: str,
                   args: list[float]) -> torch.Tensor:
    """`like`'s shape, dtype and device (not its values) filled by `Tensor.<method>(*args)`
    run on a tensor of strides `stride`; returned contiguous."""
    if method not in METHODS:
        raise ValueError(f"draw_in_layout: {method!r} is not one of {METHODS}")
    out = _strided_like(like, stride)
    getattr(out, method)(*[int(a) if method in ("random_",) else a for a in args])
    return out.contiguous()


@draw_in_layout.register_fake
def _(like, stride, method, args):
    return torch.empty_like(like, memory_format=torch.contiguous_format)


def _no_gradient(ctx, grad):
    return None, None, None, None   # a fill: its values depend on no input's


draw_in_layout.register_autograd(_no_gradient)
