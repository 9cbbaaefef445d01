"""Outputs the loss leaves out (`runtimes/absent_gradients.py`): the backward runs none of
what only they reach, as eager's autograd. Their gradients were zeros, and a zero
through an infinite local derivative is NaN (every gradient of a layer), and a sum with
zeros is a dense tensor where eager's gradient is an expanded one (a bias gradient 6e-8
off). Both were found by a search (2026-12-03). The same NaN came back from Inductor's
regions and with offloading, which took zeros still until the backward was generated for
the outputs left out (2026-12-04)."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st

import remat_ir
from remat_ir.lowering import lower_torch
from remat_ir.runtimes import compiled
from remat_ir.runtimes.torch import ScheduledModule
from remat_ir.solvers.offload import idle_gaps

from exactness import INSTANT, random_round_trips, random_schedule, side_by_side
from random_networks import RandomNet, output_values, programs
from strategies import search


class _SqrtHead(torch.nn.Module):
    """A layer's result and a metric of it the loss may leave out, whose backward divides
    by its square root: 0 / 0 where the result is not positive."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = self.linear(x)
        return h, torch.sqrt(h * (h > 0))


class _SummedHead(torch.nn.Module):
    """A normalized output the loss leaves out and a sum of the same activations it reads:
    eager's gradient of `h` is the sum's expanded one."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)
        self.dropout, self.norm = torch.nn.Dropout(0.2), torch.nn.LayerNorm(16)

    def forward(self, x):
        h = self.b(self.dropout(F.gelu(self.a(x))))
        return self.norm(h + x), h.sum(-1)


class _TwoHeads(torch.nn.Module):
    """Two heads of one layer: their gradients of `h` are dense, and the sum dies into
    one of them (`add.out`, `frontends/buffer_reuse.py`). `scale`, one weight per element,
    gets `h`'s gradient element by element (no sum loses a zero's sign on the way)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)
        self.scale = torch.nn.Parameter(torch.rand(8, 16) + 0.5)

    def forward(self, x):
        h = self.linear(x) * self.scale
        return F.gelu(h), torch.tanh(h) * 2


#: How a plan runs: op by op, in Inductor's regions, or op by op with offloads.
RUNS = ["eager", "inductor", "offload"]


def _planned(solver: str | None, x, seed: int, run: str = "eager"):
    backend = "inductor" if run == "inductor" else "eager"
    if solver is not None and run != "offload":
        return lambda m: remat_ir.remat(m, (x,), solver=solver, cost_model="flops", backend=backend)

    def scheduled(m):
        graph = lower_torch(m, (x,), cost_model="flops", backend=backend)
        rnd = random.Random(seed)
        schedule = random_schedule(graph, rnd, recompute_share=0.5)
        if run == "offload":
            schedule = random_round_trips(graph, schedule, rnd, share=0.5)
        return ScheduledModule(m, graph, schedule, backend=backend)
    return scheduled


def _trains_like_eager(model_class, loss_of, solver: str | None, seed: int, run: str = "eager",
                       **compare) -> None:
    torch.manual_seed(seed)
    model, x = model_class(), torch.randn(8, 16)
    if run == "inductor":   # Inductor's kernels round otherwise (`exactness.side_by_side`)
        compare = {"tolerance": 1e-5, "model_scale": True, **compare}
    errors = side_by_side(model, _planned(solver, x, seed, run), (x,), {}, loss_of, seed=seed, **compare)
    assert run == "inductor" or not errors, errors


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("solver", ["recompute-all", "sqrt", None])
@pytest.mark.parametrize("seed", [0, 1])
def test_an_output_whose_zero_gradient_would_be_nan_is_left_out_as_eager_leaves_it(solver, seed, run):
    """(NaN against eager's finite gradients is a drift `side_by_side` refuses.)"""
    _trains_like_eager(_SqrtHead, lambda out: out[0].pow(2).mean(), solver, seed, run)


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("solver", ["recompute-all", "sqrt", None])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_gradient_reached_also_from_a_left_out_output_is_eagers_tensor(solver, seed, run):
    _trains_like_eager(_SummedHead, lambda out: out[1].pow(2).sum(), solver, seed, run)


@pytest.mark.parametrize("read", [0, 1])
def test_a_sum_written_into_a_dying_gradient_takes_the_one_given(read):
    """The loss weighs every other column by -0.0: eager's gradient of `h` there is -0.0,
    which a sum with zeros makes +0.0 (`scale`'s gradient shows the sign, with no penalty
    added to it outside the model)."""
    torch.manual_seed(0)
    graph = lower_torch(_TwoHeads(), (torch.randn(8, 16),), cost_model="flops")
    assert any(n.op == "aten.add.out" for n in graph.proto.nodes)   # what this case is about
    weights = -torch.arange(16).remainder(2).float()
    for solver in ("recompute-all", None):
        _trains_like_eager(_TwoHeads, lambda out: (out[read] * weights).sum(), solver, 0, outside=False)


def test_the_same_step_reading_both_outputs_is_eagers_too():
    """Both outputs read, then one: the plan serves both losses."""
    torch.manual_seed(0)
    model, x = _SummedHead(), torch.randn(8, 16)
    losses, calls = [lambda out: out[0].sum() + out[1].pow(2).sum(), lambda out: out[1].pow(2).sum()], [0]

    def loss(out):   # eager's step, then the plan's: each step's loss twice
        calls[0] += 1
        return losses[(calls[0] - 1) // 2](out)
    errors = side_by_side(model, _planned("sqrt", x, 0), (x,), {}, loss, steps=2)
    assert not errors, errors


@search(12, derandomize=True)
@given(program=programs(), seed=st.integers(0, 2**32 - 1), run=st.sampled_from(RUNS), data=st.data())
def test_random_networks_trained_on_some_of_their_heads_are_exact(program, seed, run, data):
    """Random networks (`random_networks`) returning their results as heads, trained on
    a random part of them, under random schedules run each way: bitwise eager's, with
    Inductor's regions run op by op (as `test_compiled` checks regions) and fused nodes
    as Inductor's graph has them."""
    heads = output_values(program)
    assume(len(heads) >= 2)
    # A linear head always (`programs`): the loss has something to train.
    trained = next(i for i, v in enumerate(heads) if program[v - 1][0] == "linear")
    others = [i for i in range(len(heads)) if i != trained]
    kept = {trained, *data.draw(st.lists(st.sampled_from(others), max_size=len(others) - 1, unique=True))}
    width = 6
    torch.manual_seed(0)
    x = torch.randn(3, width)
    graph = lower_torch(RandomNet(program, width, heads=True), (x,), cost_model="flops")
    if run == "inductor":
        graph = compiled.fuse_for_inductor(graph)
    rnd = random.Random(seed)
    schedule = random_schedule(graph, rnd, recompute_share=0.5, defer_share=0.5)
    if run == "offload":
        assume(idle_gaps(graph, schedule, link=INSTANT))
        schedule = random_round_trips(graph, schedule, rnd, share=0.5)
    backend = "inductor" if run == "inductor" else "eager"
    torch.manual_seed(0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled.Region, "_compile", lambda region, tensors: region.eager)
        errors = side_by_side(RandomNet(program, width, heads=True),
                              lambda m: ScheduledModule(m, graph, schedule, backend=backend), (x,), {},
                              lambda out: sum((out[i] * out[i]).sum() for i in sorted(kept)), steps=2,
                              outside=run != "inductor")   # regions hand gradients whole
    assert errors == {}, f"not bitwise equal to eager: {errors}"
