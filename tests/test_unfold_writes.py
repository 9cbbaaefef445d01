"""Writes through `Tensor.unfold` windows train like eager (`frontends/unfold_writes.py`).

AOTAutograd writes an unfold view back into its base with `unfold_backward`, which
zeroes what no window covers and lays the base out contiguously: `y.unfold(1, 2, 3)
.mul_(2.0)` returned values off by 1.0 (and lost their gradients), and a write through
the windows of a transposed tensor returned a transposed result where eager's was
contiguous (gradients 1e-7 off). Searched over lengths, window sizes and steps, bases
and views of other tensors, and writes into the windows or into a view of them."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from strategies import search

import remat_ir
from remat_ir.frontends.errors import LoweringError
from remat_ir.lowering import lower_torch
from remat_ir.runtimes.torch import ScheduledModule

from exactness import random_schedule, side_by_side


class _Windows(torch.nn.Module):
    """A linear layer's (rows, length) result, or a view of it (transposed, or its rows
    from the second on), written in place through `unfold(dim, size, step)` by `op`; it
    returns the base (a write must reach it) and the view (its layout as eager's)."""

    def __init__(self, length: int, view: str, dim: int, size: int, step: int, op: str):
        super().__init__()
        self.linear = torch.nn.Linear(6, length)
        self.scale = torch.nn.Parameter(torch.rand(size) + 0.5)
        self.view, self.dim, self.size, self.step, self.op = view, dim, size, step, op

    def forward(self, x):
        base = self.linear(x)
        y = {"base": base, "transposed": base.t(), "rows": base[1:]}[self.view]
        windows = y.unfold(self.dim, self.size, self.step)
        if self.op == "mul":
            windows.mul_(self.scale)
        elif self.op == "no_grad":           # export keeps the block as a submodule
            with torch.no_grad():
                windows.mul_(2.0)
        elif self.op == "add_twice":
            windows.add_(1.5)
            windows.mul_(2.0)
        else:   # through a view of the windows: the first of each
            windows[..., 0].mul_(self.scale[0])
        return base * 1.0, y.t().contiguous() if y.dim() == 2 else y


def _refused(view: str, dim: int, length_at_dim: int, size: int, step: int) -> bool:
    """Where the windows' span is not whole steps, only a tensor of its own is written."""
    windows = (length_at_dim - size) // step + 1
    return view != "base" and windows * step > length_at_dim


@search(15)
@given(length=st.integers(2, 9), view=st.sampled_from(["base", "transposed", "rows"]),
       dim=st.integers(0, 1), wide=st.integers(0, 3), step=st.integers(1, 5),
       op=st.sampled_from(["mul", "add_twice", "first", "no_grad"]), seed=st.integers(0, 2**16))
@example(length=8, view="base", dim=1, wide=1, step=3, op="mul", seed=0)          # a gap: values
@example(length=8, view="transposed", dim=0, wide=1, step=2, op="mul", seed=0)    # the layout
@example(length=8, view="transposed", dim=0, wide=1, step=3, op="mul", seed=0)    # refused
@example(length=8, view="base", dim=1, wide=1, step=3, op="no_grad", seed=0)      # under no_grad
def test_writes_through_unfold_windows_train_like_eager(length, view, dim, wide, step, op, seed):
    """`wide` picks the window size: up to the step (wider windows overlap, and eager
    refuses to write through them) and the dimension's length."""
    rows = 4
    shape = {"base": (rows, length), "transposed": (length, rows), "rows": (rows - 1, length)}[view]
    size = 1 + wide % min(step, shape[dim])
    torch.manual_seed(seed)
    model, x = _Windows(length, view, dim, size, step, op), torch.randn(rows, 6)
    rnd = random.Random(seed)

    def scheduled(m):
        graph = lower_torch(m, (x,), cost_model="flops")
        return ScheduledModule(m, graph, random_schedule(graph, rnd, recompute_share=0.8))

    if _refused(view, dim, shape[dim], size, step):
        with pytest.raises(LoweringError, match=r"through Tensor\.unfold.*leave elements out"):
            lower_torch(model, (x,), cost_model="flops")
        return
    errors = side_by_side(model, scheduled, (x,), {}, lambda out: out[0].pow(2).sum() + out[1].pow(3).sum())
    assert not errors, errors


def test_remat_of_a_write_through_windows_with_gaps_keeps_the_elements_between():
    """The first case found, through `remat()`: the elements between windows keep their
    values and take their gradients (AOTAutograd alone zeroes them)."""
    torch.manual_seed(0)
    model, x = _Windows(8, "base", 1, 2, 3, "mul"), torch.randn(4, 6)
    scheduled = remat_ir.remat(_copy(model), (x,), solver="recompute-all", cost_model="flops")
    eager_out, out = model(x), scheduled(x)
    assert torch.equal(eager_out[0], out[0])
    assert out[1].stride() == eager_out[1].stride()
    errors = side_by_side(model, lambda m: remat_ir.remat(m, (x,), solver="recompute-all", cost_model="flops"),
                          (x,), {}, lambda out: out[0].pow(2).sum())
    assert not errors, errors


def _copy(model):
    import copy
    return copy.deepcopy(model)
