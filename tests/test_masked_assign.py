"""`x[mask] = values` trains like eager (`frontends/masked_assign.py`,
`torchlib/masked_assign.py`): values that need a gradient were refused before, since
eager's backward sums `grad[mask]`, whose rows the mask's data decides."""

from __future__ import annotations

import random

import pytest
import torch

import remat_ir
from remat_ir.lowering import lower_torch
from remat_ir.runtimes.torch import ScheduledModule

from exactness import random_schedule, side_by_side


class _Masked(torch.nn.Module):
    """Assigns through a boolean mask, per `kind`: a parameter (a mask token), a computed
    row after full dimensions (`h[:, mask]`), into a view (the write reaches its base),
    chained assignments (a parameter, a function of one, a constant), a mask computed from
    the activations, values of shape (1, width) broadcast, and `torch.index_put`."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.inner, self.out = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
        self.token, self.rows = torch.nn.Parameter(torch.randn(8)), torch.nn.Parameter(torch.randn(6, 8))

    def forward(self, x, mask):
        h = self.inner(x)
        if self.kind == "token":
            h[mask] = self.token
        elif self.kind == "after_full_dims":
            h[:, mask[0]] = self.rows[0] * 2
        elif self.kind == "into_view":
            view = h[:, 1:]
            view[mask[:, 1:]] = self.token
        elif self.kind == "chained":
            h[mask] = self.token
            h[~mask] = self.token.tanh()
            h[mask & (x[..., 0] > 0)] = 0.0
        elif self.kind == "mask_from_data":
            h[h[..., 0] > 0] = self.token * 3
        elif self.kind == "broadcast_row":
            h[mask] = self.rows.mean(0, keepdim=True)
        elif self.kind == "functional":   # refused before (found by an op sweep)
            h = torch.index_put(h, (mask,), self.token)
        return self.out(h.tanh()).square().mean() + h.sum() * 1e-3


@pytest.mark.parametrize("kind", ["token", "after_full_dims", "into_view", "chained", "mask_from_data",
                                  "broadcast_row", "functional"])
@pytest.mark.parametrize("schedule", ["recompute-all", "random"])
def test_assigning_through_a_mask_trains_like_eager(kind, schedule):
    """Bitwise, generator state included, over two steps, with every forward node
    recomputed or 80% at random; the mask differs between calls (the op reads it)."""
    torch.manual_seed(0)
    x, mask = torch.randn(4, 6, 8), torch.rand(4, 6) < 0.4

    def make(model):
        if schedule == "recompute-all":
            return remat_ir.remat(model, (x, mask), solver="recompute-all", cost_model="flops")
        graph = lower_torch(model, (x, mask), cost_model="flops")
        return ScheduledModule(model, graph, random_schedule(graph, random.Random(3), recompute_share=0.8))

    assert side_by_side(_Masked(kind), make, (x, mask), {}, lambda loss: loss, tolerance=1e-30) == {}
    other = torch.rand(4, 6) < 0.6
    assert side_by_side(_Masked(kind), make, (x, other), {}, lambda loss: loss, tolerance=1e-30) == {}


def test_a_mask_assignment_is_one_op_of_fixed_shapes():
    """The graph holds the op and its backward, and no op whose shape the data decides."""
    x, mask = torch.randn(4, 6, 8), torch.rand(4, 6) < 0.4
    graph = lower_torch(_Masked("token"), (x, mask), cost_model="flops")
    ops = [graph.node(n).op for n in graph.nodes]
    assert ops.count("remat_ir.put_masked.default") == 1
    assert ops.count("remat_ir.put_masked_backward.default") == 1
    assert not any(op.startswith(("aten.nonzero", "aten.index_put")) for op in ops), ops


class _SignedZeros(torch.nn.Module):
    """A gradient of -0.0 reaches the input where it is positive (the loss multiplies by
    -0.0 there), through a mask assignment into a tensor that is not fresh: a view
    (the write reaches its base), or a tensor another op reads too."""

    def __init__(self, kind: str, dtype=torch.float32):
        super().__init__()
        self.kind = kind
        self.token = torch.nn.Parameter(torch.randn(8, dtype=dtype))

    def forward(self, x, mask):
        h = x * 1.5
        parts = torch.view_as_real if x.is_complex() else (lambda t: t)   # each part's zero signed
        signs = -(parts(x).detach() > 0).to(parts(x).dtype)
        extra = (parts(h) * signs).sum() if self.kind == "read_elsewhere" else 0.0
        if self.kind == "into_view":
            view = h[:, 1:]
            view[mask[:, 1:]] = self.token
        elif self.kind == "after_full_dims_view":
            view = h[1:]
            view[:, mask[0]] = self.token * 2
        else:
            h[mask] = self.token
        return (parts(h) * signs).sum() + extra


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
@pytest.mark.parametrize("kind", ["into_view", "after_full_dims_view", "read_elsewhere"])
def test_a_gradient_of_minus_zero_keeps_its_sign_through_an_assignment_in_place(kind, dtype):
    """Eager's `index_put_` backward copies the gradient; writing the op's result back
    with `copy_` added zeros to it, and -0.0 + 0.0 is +0.0 (`torch.equal` does not tell,
    `side_by_side` does). A complex tensor's parts each keep theirs."""
    torch.manual_seed(0)
    x, mask = torch.randn(4, 6, 8, dtype=dtype, requires_grad=True), torch.rand(4, 6) < 0.4
    _SignedZeros(kind, dtype)(x, mask).backward()
    grad = torch.view_as_real(x.grad) if dtype.is_complex else x.grad
    assert bool((grad == 0).logical_and(grad.signbit()).any())   # eager's -0.0 is there to keep
    x.grad = None

    def make(model):
        graph = lower_torch(model, (x, mask), cost_model="flops")
        return ScheduledModule(model, graph, random_schedule(graph, random.Random(3), recompute_share=0.8))

    assert side_by_side(_SignedZeros(kind, dtype), make, (x, mask), {}, lambda loss: loss, tolerance=1e-30) == {}
