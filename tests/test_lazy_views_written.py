"""Lazily conjugated or negated complex tensors (`z.conj()`, `torch._neg_view`) that the
forward writes in place: the step's copy back writes through them as eager's write does
(hunt73: `_foreach_copy_` raised torch's error from inside at the first call)."""

from __future__ import annotations

import pytest
import torch

import remat_ir


class _ScalesItsInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c = torch.nn.Linear(8, 8, dtype=torch.complex64)

    def forward(self, z):
        z.mul_(2)
        return self.c(z).abs()


class _DecaysItsPhase(torch.nn.Module):
    def __init__(self, view):
        super().__init__()
        self.c = torch.nn.Linear(8, 8, dtype=torch.complex64)
        self.register_buffer("phase", view(torch.randn(8, dtype=torch.complex64)))

    def forward(self, z):
        with torch.no_grad():
            self.phase.mul_(0.5)
        return (self.c(z) * self.phase).abs()


_VIEWS = {"conj": torch.conj, "neg": torch._neg_view}


@pytest.mark.parametrize("view", _VIEWS, ids=list(_VIEWS))
@pytest.mark.parametrize("member", [False, True], ids=["input", "buffer"])
def test_a_lazy_conjugate_or_negative_view_written_in_place_trains_as_eager(view, member):
    make = (lambda: _DecaysItsPhase(_VIEWS[view])) if member else _ScalesItsInput
    torch.manual_seed(0)
    eager = make()
    torch.manual_seed(0)
    model = make()
    inputs = []
    for _ in range(3):
        torch.manual_seed(1)
        z = torch.randn(4, 8, dtype=torch.complex64)
        inputs.append(z if member else _VIEWS[view](z))
    scheduled = remat_ir.remat(model, (inputs[0],), solver="recompute-all", cost_model="flops")
    for step in range(2):
        ours, theirs = scheduled(inputs[1]), eager(inputs[2])
        ours.sum().backward()
        theirs.sum().backward()
        assert torch.equal(ours, theirs), step
        assert torch.equal(inputs[1].resolve_conj().resolve_neg(), inputs[2].resolve_conj().resolve_neg())
        assert torch.equal(model.phase.resolve_conj().resolve_neg(), eager.phase.resolve_conj().resolve_neg()) \
            if member else True
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(eager.parameters(), model.parameters()))
