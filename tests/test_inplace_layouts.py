"""An in-place op keeps the layout of the tensor it writes (`frontends/inplace_layouts.py`).

AOTAutograd reads the functional op's result wherever the written tensor is read after
the op; `masked_fill`, `index_put` and others clone into a contiguous tensor first, so a
write through a transposed view left the traced tensor transposed where eager's keeps its
layout, and later reductions summed in another order (gradients 3.8e-6 off, the loss
equal, under every schedule). Each case writes in place into a tensor that is not
contiguous, or through a view that is not, then reduces and multiplies both the base and
the view, and trains bitwise like eager under random schedules."""

from __future__ import annotations

import contextlib
import random

import pytest
import torch

from remat_ir.frontends.errors import LoweringError
from remat_ir.lowering import lower_torch
from remat_ir.runtimes.torch import ScheduledModule

from exactness import random_schedule, side_by_side

_N = 24


def _write(kind: str, y: torch.Tensor, mask: torch.Tensor, other: torch.Tensor) -> None:
    """Write into `y` in place (`y` and `mask` and `other` of one shape) as `kind` says."""
    rows = torch.arange(0, y.shape[0], 2)
    if kind == "masked_fill":
        y.masked_fill_(mask, 0.25)
    elif kind == "masked_fill_tensor":
        y.masked_fill_(mask, other[0, 0])
    elif kind == "index_put":
        y[rows] = other[rows]
    elif kind == "masked_scatter":
        y.masked_scatter_(mask, other)
    elif kind == "index_fill":
        y.index_fill_(0, rows, -1.0)
    elif kind == "scatter":
        y.scatter_(1, (other.abs() * 7).long() % y.shape[1], other)
    elif kind == "index_add":
        y.index_add_(0, rows, other[: len(rows)])
    elif kind == "index_copy":
        y.index_copy_(0, rows, other[: len(rows)])
    elif kind == "cumprod":
        y.cumprod_(1)
    elif kind == "scatter_reduce":
        y.scatter_reduce_(1, (other.abs() * 7).long() % y.shape[1], other, reduce="amax")
    elif kind == "mul":   # by a tensor needing a gradient: the op saves the written tensor
        y.mul_(other)
    elif kind == "restrided":   # shape and strides changed in place: no element written
        y.as_strided_(y.shape, tuple(reversed(y.stride())))
    else:   # a pointwise op with a second operand of another layout
        y.add_(other.t().contiguous().t(), alpha=0.5)


class _Written(torch.nn.Module):
    def __init__(self, kind: str, target: str, block: str = "none"):
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Linear(_N, _N) for _ in range(3))
        self.kind, self.target, self.block = kind, target, block

    def forward(self, x, mask):
        z = self.a(x) * 1
        other = self.c(x)
        # A block torch.export keeps as a region of its own (a submodule of the graph).
        with {"none": contextlib.nullcontext, "no_grad": torch.no_grad,
              "autocast_off": lambda: torch.autocast("cpu", enabled=False)}[self.block]():
            if self.target == "transposed_view":
                _write(self.kind, z.t(), mask.t(), other.t())
            elif self.target == "strided_view":
                _write(self.kind, z[:, ::2], mask[:, ::2], other[:, ::2])
            else:   # a tensor of its own, laid out column-major
                z = z.t().contiguous().t()
                _write(self.kind, z, mask, other)
        s = z.sum(0, keepdim=True)
        return self.b(z * s.tanh()).sin()


_KINDS = ["masked_fill", "masked_fill_tensor", "index_put", "masked_scatter", "index_fill", "scatter",
          "index_add", "index_copy", "cumprod", "scatter_reduce", "add"]
#: Found by a review: in a block export keeps as a region, still 2.3e-5 off (the first
#: fix tagged the nodes' metadata, which AOTAutograd does not run a region's nodes under);
#: a first fix writing `y.copy_(op(y))` refused an op saving its written tensor.
_MORE = [("masked_fill", "transposed_view", "no_grad"), ("scatter", "column_major", "autocast_off"),
         ("mul", "strided_view", "none"), ("mul", "transposed_view", "none"),
         # Found by a review of the fix: `as_strided_` taken for a write, its strides lost.
         ("restrided", "column_major", "none")]


@pytest.mark.parametrize("kind, target, block", [(kind, target, "none") for kind in _KINDS
                                                 for target in ("transposed_view", "column_major")] + _MORE)
def test_a_write_in_place_keeps_the_written_tensors_layout(kind, target, block):
    torch.manual_seed(0)
    model = _Written(kind, target, block)
    x, mask = torch.randn(_N, _N), torch.rand(_N, _N) > 0.5

    def scheduled(m):
        graph = lower_torch(m, (x, mask), cost_model="flops")
        return ScheduledModule(m, graph, random_schedule(graph, random.Random(1), recompute_share=0.8))

    errors = side_by_side(model, scheduled, (x, mask), {}, lambda out: out.sum())
    assert not errors, errors


class _Unwritable(torch.nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.a, self.kind = torch.nn.Linear(8, 8), kind

    def forward(self, x):
        z = self.a(x) * 1
        if self.kind == "overlapping_unfold":
            z.unfold(1, 2, 1).relu_()
        else:
            z.t().fill_diagonal_(0.5)
        return z.sin().sum()


@pytest.mark.parametrize("kind, said", [
    ("overlapping_unfold", r"writes in place through Tensor.unfold windows that overlap at .*test_inplace_layouts"
                           r"\.py:\d+ in forward: .*Write into the windows' copy"),
    ("fill_diagonal", r"writes in place through an as_strided view of a view of another tensor at "
                      r".*test_inplace_layouts\.py:\d+ in forward .*`z\.t\(\)\.diagonal\(\)\.fill_\(0\.5\)`")])
def test_a_write_functionalization_cannot_follow_is_refused_by_line(kind, said):
    """Found by a review: both said in torch.compile's words (graph breaks), naming no line."""
    with pytest.raises(LoweringError, match=said):
        lower_torch(_Unwritable(kind), (torch.randn(8, 8),), cost_model="flops")
