"""Long-lived views copied out of their storage (frontends/view_compaction.py).

A skip connection concatenated into a decoder: the backward of `cat` hands the
skip its gradient as a slice of the concatenated gradient, read only after the
whole deep path's backward. Without a copy the slice holds the whole gradient's
storage all that time."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given

from remat_ir import ir
from remat_ir.frontends.torch import lower
from remat_ir.lowering import lower_torch
from remat_ir.runtimes.torch import ScheduledModule

from exactness import SCHEDULE_DRAWS, copy_model, random_schedule, side_by_side
from strategies import search


class SkipNet(torch.nn.Module):
    """enc -> `depth` convolutions -> cat with enc (channels, or the last dimension) -> head."""

    def __init__(self, channels=4, depth=6, cat_dim=1):
        super().__init__()
        self.cat_dim = cat_dim
        self.enc = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.path = torch.nn.ModuleList(torch.nn.Conv2d(channels, channels, 3, padding=1) for _ in range(depth))
        width = 2 * channels if cat_dim == 1 else channels
        self.head = torch.nn.Conv2d(width, 3, 1)

    def forward(self, x):
        skip = torch.tanh(self.enc(x))
        h = skip
        for conv in self.path:
            h = torch.relu(conv(h))
        return self.head(torch.cat([h, skip], dim=self.cat_dim)).square().mean()


def _made():
    torch.manual_seed(0)
    return torch.randn(2, 3, 8, 8)


def _storage_last_reads(graph: ir.Graph, schedule) -> dict[int, int]:
    """Per storage of the graph's activations and gradients, the last compute step reading it."""
    values = {v.id: v for v in graph.proto.values}
    last = {}
    for k, step in enumerate(schedule.steps):
        if step.HasField("compute"):
            for v in graph.node(step.compute).inputs:
                last[values[v].storage_id] = k
    return last


@pytest.mark.parametrize("cat_dim", [1, 3], ids=["channels", "last-dim"])
def test_skip_gradient_is_copied_and_its_storage_dies_early(cat_dim):
    x = _made()
    compacted = lower(SkipNet(cat_dim=cat_dim), (x,))
    plain = lower(SkipNet(cat_dim=cat_dim), (x,), copy_long_lived_views=False)
    copies = [n for n in compacted.proto.nodes
              if n.op == "aten.clone.default" and n.phase == ir.pb.BACKWARD
              and compacted.node(compacted.producer(n.inputs[0])).op == "aten.slice.Tensor"]
    assert len(copies) == 1, [n.name for n in copies]
    copy_node = copies[0]
    values = {v.id: v for v in compacted.proto.values}
    view = values[copy_node.inputs[0]]
    out = values[copy_node.outputs[0]]
    # The copy holds the view's bytes only, in a storage of its own, and nothing but the
    # copy reads the view after the storage's other reads.
    assert out.size_bytes == view.size_bytes and out.storage_id != view.storage_id
    store = ir.store_all(compacted)
    order = [s.compute for s in store.steps if s.HasField("compute")]
    assert _storage_last_reads(compacted, store)[view.storage_id] == next(
        k for k, s in enumerate(store.steps) if s.HasField("compute") and s.compute == copy_node.id)
    readers_of_copy = [order.index(n.id) for n in compacted.proto.nodes if out.id in n.inputs]
    assert readers_of_copy and min(readers_of_copy) > order.index(copy_node.id) + 1
    # Memory over the step: the whole concatenated gradient (twice the view) was held
    # from the copy to the skip's late read; now the view's bytes are, at every step between.
    with_copy = ir.simulate(compacted, store)
    without = ir.simulate(plain, ir.store_all(plain))
    assert with_copy.peak_bytes <= without.peak_bytes
    storage = max(v.size_bytes for v in values.values() if v.storage_id == view.storage_id)
    assert storage >= 2 * view.size_bytes
    span = min(readers_of_copy) - order.index(copy_node.id)
    saved = sum(without.memory_after) - sum(with_copy.memory_after)
    assert saved >= (storage - view.size_bytes) * (span - 1), (saved, storage, view.size_bytes, span)


@search(6, derandomize=True)
@given(**SCHEDULE_DRAWS)
def test_random_schedules_with_copies_train_like_eager(seed, recompute, defer, groups):
    x = _made()
    torch.manual_seed(1)
    model = SkipNet(depth=3)
    graph = lower_torch(model, (x,), cost_model="flops")
    assert any(n.op == "aten.clone.default" and n.phase == ir.pb.BACKWARD for n in graph.proto.nodes)
    schedule = random_schedule(graph, random.Random(seed), recompute_share=recompute, defer_share=defer)
    errors = side_by_side(copy_model(model), lambda m: ScheduledModule(m, graph, schedule, gradient_groups=groups),
                          (x,), {}, lambda out: out, steps=2)
    assert errors == {}, f"not bitwise equal to eager: {errors}"


def test_a_strided_view_read_by_a_reduction_keeps_eagers_layout():
    """Soak, 2026-11-28: a slice of a `cat`'s gradient (3x6 of 3x12, strided) read late by
    a batch-norm backward was copied into a contiguous tensor, and the reduction summed in
    another order: its weight's gradient 4e-8 off eager's on store-everything. Such a view
    is not copied (only pointwise readers and convolution backwards take a copy's layout),
    and the step is bitwise eager's."""
    from random_networks import RandomNet

    program = [("relu", (0,)), ("add", (0, 0)), ("batch_norm", (0,)), ("relu", (0,)), ("layer_norm", (0,)),
               ("add", (0, 0)), ("cat_linear", (0, 3)), ("linear", (7,))]
    torch.manual_seed(0)
    x = torch.randn(3, 6)
    graph = lower_torch(RandomNet(program, 6), (x,), cost_model=None)
    for node in graph.proto.nodes:
        if node.op == "aten.clone.default":
            readers = {graph.node(u).op for u in graph.users(node.outputs[0])}
            assert "aten.native_batch_norm_backward.default" not in readers, readers
    torch.manual_seed(0)
    errors = side_by_side(RandomNet(program, 6), lambda m: ScheduledModule(m, graph, ir.store_all(graph)),
                          (x,), {}, lambda out: out)
    assert errors == {}, errors


class _Spectral(torch.nn.Module):
    """Linear -> a 2-D FFT's real part (a view with stride 2 of the complex result) ->
    GELU -> Linear: the view is read by the GELU and, late, by its backward."""

    def __init__(self):
        super().__init__()
        self.inner, self.outer = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x):
        spectrum = torch.fft.fft(torch.fft.fft(self.inner(x), dim=-1), dim=-2)
        return self.outer(torch.nn.functional.gelu(spectrum.real)).pow(2).mean()


def test_a_strided_view_read_by_a_transcendental_op_keeps_eagers_layout():
    """A probe, 2026-11-29: the real part of an FFT read by a GELU (and its backward) was
    copied into a contiguous tensor, as pointwise readers took any layout; ATen's GELU
    rounds its vectorized kernel (run on the copy) and its scalar one (run on eager's
    stride-2 view) differently, and every gradient was up to 2.4e-7 off eager's on
    store-everything. Only exact arithmetic takes a copy's layout now: bitwise."""
    torch.manual_seed(0)
    x = torch.randn(8, 16)
    graph = lower_torch(_Spectral(), (x,), cost_model=None)
    torch.manual_seed(0)
    errors = side_by_side(_Spectral(), lambda m: ScheduledModule(m, graph, ir.store_all(graph)),
                          (x,), {}, lambda out: out)
    assert errors == {}, errors
