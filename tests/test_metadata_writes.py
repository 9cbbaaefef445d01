"""In-place ops that change only a tensor's shape and strides (`t_`, `squeeze_`,
`unsqueeze_`, `transpose_`, `swapaxes_`) train like eager (`frontends/metadata_writes.py`):
on a view of another tensor AOTAutograd refused them with its internal message
("invalid gradient at index 0 - got [16, 8] but expected shape compatible with
[8, 1, 16]"), where eager trains them."""

from __future__ import annotations

import random

import pytest
import torch

from remat_ir.lowering import lower_torch
from remat_ir.runtimes.torch import ScheduledModule

from exactness import random_schedule, side_by_side


class _Reshaped(torch.nn.Module):
    """A layer's result `h`, a tensor made from it reshaped in place by `kind`, then
    written in place: both returned (the write reaches `h` where the tensor views it)."""

    def __init__(self, kind: str):
        super().__init__()
        self.linear, self.kind = torch.nn.Linear(16, 16), kind

    def forward(self, x):
        h = self.linear(x)
        if self.kind == "squeeze_then_t":       # a view of h, squeezed and transposed
            y = h[:, None]
            y.squeeze_(1)
            y.t_()
            y.add_(1.0)
        elif self.kind == "transpose_of_rows":  # rows of h, transposed
            y = h[2:]
            y.transpose_(0, 1)
            y.mul_(2.0)
        else:                                   # a tensor of its own, two dimensions swapped
            y = h * 3
            y.unsqueeze_(0)
            y.swapaxes_(0, 2)
        return y * 1.0, h


@pytest.mark.parametrize("kind", ["squeeze_then_t", "transpose_of_rows", "unsqueeze_then_swapaxes"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_tensor_reshaped_in_place_trains_like_eager(kind, seed):
    torch.manual_seed(seed)
    model, x = _Reshaped(kind), torch.randn(8, 16)

    def scheduled(m):
        graph = lower_torch(m, (x,), cost_model="flops")
        return ScheduledModule(m, graph, random_schedule(graph, random.Random(seed), recompute_share=0.8))

    errors = side_by_side(model, scheduled, (x,), {}, lambda out: out[0].pow(2).sum() + out[1].sum())
    assert not errors, errors
