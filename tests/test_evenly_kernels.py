"""The gradient of a whole-tensor `max`, `min`, `median`, `nanmedian` (`frontends/evenly_kernels.py`).

Traced, ATen's backward multiplied the mask by the share, so under a negative gradient the
other elements' gradients were -0.0 where eager's are +0.0 (hunt76 F8)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import remat_ir
from remat_ir.frontends.evenly_kernels import evenly_distributed

from exactness import _bitwise_equal, side_by_side

_OPS = {"max": torch.max, "min": torch.min, "median": torch.median, "nanmedian": torch.nanmedian}


@settings(max_examples=200, deadline=None)
@given(op=st.sampled_from(sorted(_OPS)), values=st.lists(st.sampled_from([-2.0, 0.0, -0.0, 1.5, 3.0, float("nan")]),
                                                         min_size=1, max_size=12),
       upstream=st.sampled_from([-1.0, -0.25, 0.0, -0.0, 2.0]), transposed=st.booleans())
def test_the_formula_is_eagers_backward_bit_for_bit(op, values, upstream, transposed):
    x = torch.tensor(values)
    if transposed and x.numel() % 2 == 0:
        x = x.view(2, -1).t()
    x.requires_grad_()
    result = _OPS[op](x)
    (eager,) = torch.autograd.grad(result, x, torch.tensor(upstream))
    assert _bitwise_equal(evenly_distributed(torch.tensor(upstream), x.detach(), result.detach()), eager)


class _Picks(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.p = torch.nn.Parameter(torch.tensor([[1.0, 3.0, 3.0, -2.0], [0.5, 3.0, 0.0, 1.0]]))
        self.op = op

    def forward(self, x):
        return x * -_OPS[self.op](self.p)


@pytest.mark.parametrize("op", sorted(_OPS))
@pytest.mark.parametrize("solver", ["autograd", "recompute-all"])
def test_a_whole_tensor_pick_under_a_negative_gradient_trains_with_eagers_zeros(op, solver):
    x = torch.rand(2, 4) + 0.1   # the pick's gradient is negative
    errors = side_by_side(_Picks(op), lambda m: remat_ir.remat(m, x, solver=solver, cost_model="flops",
                                                                cache_dir=False),
                          (x,), {}, lambda y: y.sum(), steps=2, outside=False)
    assert errors == {}   # -0.0 where eager has +0.0 before
