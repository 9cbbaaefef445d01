"""Regressions of the exactness issue: each construct that used to train silently wrong
or crash now trains like eager or gets one clear error."""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch

import remat_ir
from remat_ir.frontends.torch import LoweringError
from remat_ir.lowering import lower_torch
from remat_ir.ir import RematIRError, pb
from remat_ir.runtimes.torch import RuntimeInputError

import zoo_models
from exactness import side_by_side


def _remat(model, args, **options):
    return remat_ir.remat(model, args, cost_model="flops", **options)


@pytest.mark.parametrize("solver", ["autograd", "recompute-all"])
def test_custom_function_backward_is_what_runs(solver):
    """A straight-through estimator trains with its own backward (round's derivative is
    zero: the first layer's gradient would vanish), and a Function that saves tensors and
    a constant with a backward unlike its forward's derivative."""
    model, args, kwargs, loss_of = zoo_models.straight_through()
    errors = side_by_side(model, lambda m: _remat(m, args, solver=solver), args, kwargs, loss_of)
    assert errors == {}
    fresh = copy.deepcopy(model)
    scheduled = _remat(fresh, args, solver=solver)
    loss_of(scheduled(*args)).backward()
    assert fresh.a.weight.grad.abs().sum() > 0  # through the straight-through backward
    ops = {n.op for n in scheduled.graph.proto.nodes}
    assert any(op.startswith("remat_ir_fn.straightthroughround_") for op in ops)


class _InPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.mark_dirty(x)
        return x.mul_(2)

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class _UsesInPlace(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return _InPlace.apply(self.linear(x)).sum()


def test_custom_function_that_cannot_be_preserved_is_refused_by_name():
    with pytest.raises(LoweringError, match=r"_InPlace marks inputs dirty.*\(in _UsesInPlace\)"):
        lower_torch(_UsesInPlace(), (torch.randn(2, 4),), cost_model="flops")


class _Constants(torch.nn.Module):
    """Tensors built inside forward: torch.export lifts them as constants (T5's
    `_shift_right` start token; transformers' empty placeholders)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, x):
        offsets = torch.tensor([0.5, -1.0, 2.0])
        empty = torch.tensor([])
        return (self.linear(x) * offsets).sum() + empty.sum()


def test_lifted_and_zero_element_constants():
    model = _Constants()
    x = torch.randn(2, 3)
    graph = lower_torch(model, (x,), cost_model="flops")
    constants = [v for v in graph.proto.values if v.kind == pb.CONSTANT]
    assert sorted(len(v.constant.raw) for v in constants) == [0, 12]
    errors = side_by_side(model, lambda m: _remat(m, (x,), solver="recompute-all"), (x,), {},
                          lambda out: out)
    assert errors == {}


@pytest.mark.parametrize("groups", [1, 64])
def test_second_backward_is_a_clear_error(groups):
    model, args, _, loss_of = zoo_models.mlp_dropout()
    scheduled = _remat(model, args, gradient_groups=groups)
    loss = loss_of(scheduled(*args))
    loss.backward(retain_graph=True)
    with pytest.raises(RematIRError, match="retain_graph=True"):
        loss.backward()


@pytest.mark.parametrize("groups", [1, 64])
def test_autograd_grad_of_some_parameters_equals_eager(groups):
    """`torch.autograd.grad` for the first layer's weight alone (the last group the
    backward hands over) and for the last layer's (the first): the gradients eager
    computes, and no `.grad` is written."""
    model, args, _, loss_of = zoo_models.mlp_dropout()
    eager = copy.deepcopy(model)
    scheduled = _remat(model, args, solver="recompute-all", gradient_groups=groups)
    first, last = model.body[0].weight, model.body[-1].weight
    for wanted, eager_wanted in ((first, eager.body[0].weight), (last, eager.body[-1].weight)):
        torch.manual_seed(3)
        (ours,) = torch.autograd.grad(loss_of(scheduled(*args)), [wanted])
        torch.manual_seed(3)
        (theirs,) = torch.autograd.grad(loss_of(eager(*args)), [eager_wanted])
        assert torch.equal(ours, theirs)
    assert all(p.grad is None for p in model.parameters())


def test_scheduled_module_pickles_and_copies_quietly():
    model, args, kwargs, loss_of = zoo_models.mlp_dropout()
    scheduled = _remat(model, args, solver="recompute-all")
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.save(scheduled, buffer)
        copied = copy.deepcopy(scheduled)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for other in (copied, loaded):
        assert other.schedule == scheduled.schedule
        assert other.graph.proto == scheduled.graph.proto
        assert other.parameters().__next__() is not model.body[0].weight
        errors = side_by_side(model, lambda m, o=other: o, args, kwargs, loss_of, steps=1)
        assert errors == {}


def test_flipped_module_attribute_is_detected():
    model, args, _, _ = zoo_models.mlp_dropout()
    scheduled = _remat(model, args)
    scheduled(*args).backward()
    model.body[2].p = 0.5
    with pytest.raises(RuntimeInputError, match=r"'body\.2\.p' .* was 0\.2 .* is 0\.5"):
        scheduled(*args)
    model.body[2].p = 0.2
    scheduled(*args).backward()  # back as lowered: runs again


def _grad_scaling_function(factor: float) -> type:
    """A Function class named `GradScale` whose backward scales by `factor`: two such
    classes in one process are what a notebook cell defining one and run twice leaves."""

    class GradScale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, constant):
            return x * 1.0

        @staticmethod
        def backward(ctx, grad):
            return grad * factor, None

    return GradScale


class _ScaledGradients(torch.nn.Module):
    def __init__(self, function: type, constant):
        super().__init__()
        self.linear, self.function, self.constant = torch.nn.Linear(4, 4), function, constant

    def forward(self, x):
        return self.function.apply(self.linear(x), self.constant).square().sum()


def test_functions_alike_in_name_or_repr_keep_their_own_backwards():
    """Each Function op's name digests its class's qualified name and its constants; a
    second class of the same name, or constants whose `repr` is the same (numpy elides
    long arrays), still gets an op of its own."""
    import numpy as np
    x = torch.randn(3, 4)
    long_a, long_b = np.zeros(2000), np.zeros(2000)
    long_b[1000] = 1.0
    assert repr(long_a) == repr(long_b)
    cases = [(_grad_scaling_function(2.0), long_a), (_grad_scaling_function(3.0), long_a)]
    cases.append((cases[0][0], long_b))
    ops = set()
    for function, constant in cases:
        model = _ScaledGradients(function, constant)
        errors = side_by_side(model, lambda m: _remat(m, (x,)), (x,), {}, lambda out: out)
        assert errors == {}
        ops |= {n.op for n in _remat(model, (x,)).graph.proto.nodes if n.op.startswith("remat_ir_fn")}
    assert len(ops) == 3, ops


#: Run in a fresh process: a saved module whose graph holds Function ops runs where the
#: same model was lowered, and nowhere else (not on another call's op of the same class).
_LOAD_ELSEWHERE = """
import sys, copy, torch, remat_ir, zoo_models
from torch import nn
saved = sys.argv[1]

def step(module, seed):
    torch.manual_seed(seed)
    module.zero_grad(set_to_none=True)
    module(*args).backward()
    return [p.grad.clone() for p in module.parameters()]

model, args, _, _ = zoo_models.straight_through()
eager = copy.deepcopy(model)
try:
    torch.load(saved, weights_only=False)(*args)
except remat_ir.ir.RematIRError as exc:
    assert "custom torch.autograd.Function" in str(exc), exc
    print("refused before lowering")

class OtherConstant(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
    def forward(self, x, target):
        return zoo_models.ScaledTanh.apply(self.a(x), 3.0).sum()

remat_ir.remat(OtherConstant(), args, cost_model="flops")
try:
    torch.load(saved, weights_only=False)(*args)
except remat_ir.ir.RematIRError as exc:
    print("refused beside another constant's op")

remat_ir.remat(copy.deepcopy(model), args, cost_model="flops")
loaded = torch.load(saved, weights_only=False)
assert all(torch.equal(a, b) for a, b in zip(step(loaded, 1), step(eager, 1)))
print("ran where lowered")
"""


def test_a_saved_module_with_function_ops_runs_only_where_they_were_lowered(tmp_path):
    """Function ops exist in the process that lowered the model (their names are
    deterministic): a saved module runs, with eager's gradients, in a process that lowered
    the same model; elsewhere one clear error, never another Function's op run instead
    (before, ops were numbered per process: `scaledtanh_0` in both)."""
    import subprocess
    import sys
    from pathlib import Path
    model, args, _, _ = zoo_models.straight_through()
    saved = tmp_path / "scheduled.pt"
    torch.save(_remat(model, args, budget=0.9), saved)
    tests = Path(__file__).resolve().parent
    done = subprocess.run([sys.executable, "-c", _LOAD_ELSEWHERE, str(saved)], capture_output=True,
                          text=True, timeout=300, cwd=tests,
                          env={**__import__("os").environ,
                               "PYTHONPATH": f"{tests.parent / 'benchmarks'}:{tests}"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:3] == ["refused before lowering", "refused beside another "
                                           "constant's op", "ran where lowered"], done.stdout
