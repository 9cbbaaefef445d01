"""Tensors whose elements share memory, written in place by the forward (hunt73): eager
writes them element by element, the graph computes the whole write from the values before
it; refused by name (`runtimes/torch.py` `overlapping_write`), tested exactly
(`torchlib/types.overlaps_itself`)."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import remat_ir
from remat_ir.runtimes.torch import RuntimeInputError
from remat_ir.torchlib.types import overlaps_itself


@settings(max_examples=300, deadline=None)
@given(dims=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 7)), max_size=4))
def test_overlaps_itself_is_exact_on_random_layouts(dims):
    """Against the offsets of every index counted one by one: interleaved strides that do
    not meet (the conservative check's false alarms) are told from ones that do."""
    shape, stride = [size for size, _ in dims], [s for _, s in dims]
    span = 1 + sum((size - 1) * s for size, s in dims)
    tensor = torch.zeros(span).as_strided(shape, stride)
    offsets = [sum(i * s for i, s in zip(index, stride)) for index in itertools.product(*map(range, shape))]
    assert overlaps_itself(tensor) == (len(set(offsets)) < len(offsets))


class _WritesItsInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(8, 8)

    def forward(self, x):
        x.sub_(x.mean(-1, keepdim=True))
        return self.l(x)


class _DecaysItsFrames(torch.nn.Module):
    """Overlapping frames of a signal held as a buffer (or a parameter over windows of one
    vector), decayed in place under no_grad."""

    def __init__(self, parameter: bool):
        super().__init__()
        self.l = torch.nn.Linear(8, 8)
        frames = torch.randn(4, 68).unfold(-1, 8, 4)[:, :8]
        if parameter:
            self.frames = torch.nn.Parameter(frames)
        else:
            self.register_buffer("frames", frames)

    def forward(self, x):
        with torch.no_grad():
            self.frames.mul_(0.9)
        return self.l(x) + self.frames.sum(-1)


def test_an_input_whose_elements_share_memory_written_in_place_is_refused_by_name():
    """Found by hunt73: overlapping frames of a signal (`unfold(-1, 8, 4)`), normalized in
    place in the forward: outputs 0.99 off eager's, the caller's buffer 1.01, silently.
    A transposed or stepped input, whose elements are its own, trains as eager's (a stepped
    one was 3.8e-6 off: the backward recomputed its mean from a dense copy of it, now a
    copy in its layout, `runtimes/torch._snapshot`)."""
    torch.manual_seed(0)
    model = _WritesItsInput()
    scheduled = remat_ir.remat(model, (torch.randn(4, 16, 8),), solver="recompute-all", cost_model="flops")
    for frames in (torch.randn(4, 68).unfold(-1, 8, 4), torch.randn(200).as_strided((4, 16, 8), (8, 8, 1))):
        with pytest.raises(RuntimeInputError, match=r"argument args\[0\] has elements that share memory .* "
                                                    r"writes into it in place.* Pass a copy"):
            scheduled(frames)
    eager = _WritesItsInput()
    eager.load_state_dict(model.state_dict())
    for make in (lambda: torch.randn(4, 8, 16).transpose(1, 2), lambda: torch.randn(4, 16, 16)[..., ::2]):
        torch.manual_seed(1)
        theirs = make()
        torch.manual_seed(1)
        ours = make()
        eager.zero_grad()
        model.zero_grad()
        eager(theirs).square().sum().backward()
        scheduled(ours).square().sum().backward()
        assert torch.equal(theirs, ours)
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(eager.parameters(), model.parameters()))


@pytest.mark.parametrize("parameter", [False, True], ids=["buffer", "parameter"])
def test_a_member_whose_elements_share_memory_written_in_place_is_refused_by_name(parameter):
    """Found by hunt73: a buffer of overlapping frames decayed in place, 0.51 off eager's
    output; a parameter over windows of one vector, 0.041."""
    torch.manual_seed(0)
    model = _DecaysItsFrames(parameter)
    with pytest.raises(RuntimeInputError, match=rf"{'parameter' if parameter else 'buffer'} 'frames' has elements "
                                                r"that share memory"):
        remat_ir.remat(model, (torch.randn(4, 8),), solver="recompute-all", cost_model="flops")(torch.randn(4, 8))
