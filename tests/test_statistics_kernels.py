"""`torch.cov` and `torch.corrcoef` train like eager (`frontends/statistics_kernels.py`):
refused before as an op whose value depends on tensor data (ATen's `cov` reads whether
its degrees of freedom are positive from a tensor), where a VICReg-style loss needs them."""

from __future__ import annotations

import random

import pytest
import torch

from exactness import random_schedule, side_by_side
from remat_ir.frontends.errors import LoweringError
from remat_ir.lowering import lower_torch
from remat_ir.runtimes.torch import ScheduledModule


class _Statistics(torch.nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.a, self.kind = torch.nn.Linear(8, 6), kind

    def forward(self, x):
        z = self.a(x)
        if self.kind == "cov":
            return torch.cov(z.t()).pow(2).sum()
        if self.kind == "cov_uncorrected":
            return torch.cov(z.t(), correction=0).pow(2).sum()
        if self.kind == "corrcoef":
            return torch.corrcoef(z.t()).sum()
        if self.kind == "one_variable":
            return torch.cov(z[:, 0])
        if self.kind == "complex":
            return torch.cov(torch.complex(z, z.cos()).t()).abs().sum()
        return torch.cov(z.t(), fweights=torch.ones(z.shape[0], dtype=torch.long)).sum()


@pytest.mark.parametrize("kind", ["cov", "cov_uncorrected", "corrcoef", "one_variable", "complex"])
def test_cov_and_corrcoef_train_like_eager_under_random_schedules(kind):
    torch.manual_seed(0)
    x = torch.randn(16, 8)

    def scheduled(m):
        graph = lower_torch(m, (x,), cost_model="flops")
        return ScheduledModule(m, graph, random_schedule(graph, random.Random(0), recompute_share=0.8))

    assert side_by_side(_Statistics(kind), scheduled, (x,), {}, lambda out: out, tolerance=1e-30) == {}


def test_cov_with_weights_is_still_refused_naming_the_line():
    """Its degrees of freedom depend on the weights' values: ATen's kernel, refused."""
    with pytest.raises(LoweringError, match=r"aten\.\w+\.\w+ at .*test_statistics_kernels\.py:\d+ in forward"):
        lower_torch(_Statistics("weighted"), (torch.randn(16, 8),), cost_model="flops")
