"""A forward's branches on its inputs' values (`frontends/input_branches.py`): taken as
eager takes them for the call's inputs, checked at every call, planned again where a
call's values take the other branch; refused where the value reads the model's tensors."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

import remat_ir
from remat_ir.frontends.errors import LoweringError
from remat_ir.ir import store_all as ir_store_all
from remat_ir.lowering import lower_torch
from remat_ir.runtimes.torch import RuntimeInputError, ScheduledModule
from exactness import random_schedule

CLASSES, WIDTH = 6, 16


class Branching(nn.Module):
    """Checks its labels as transformers' CTC heads and ProphetNet do, and computes
    otherwise where a label is 0 (as FSMT drops a padding mask no token uses)."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, CLASSES)

    def forward(self, x, labels):
        if labels.max() >= CLASSES:
            raise ValueError(f"Label values must be < {CLASSES}")
        assert torch.all(labels >= 0).item(), "labels must not be negative"
        h = torch.tanh(self.a(x))
        if (labels == 0).any():
            h = torch.dropout(h, 0.2, True) * 2
        h = torch.relu(self.b(h)) + h
        return nn.functional.cross_entropy(self.c(h), labels)


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def _step(module: nn.Module, x, labels, seed: int = 5) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """Loss, gradients and the generator state after one step from `seed`."""
    for p in module.parameters():
        p.grad = None
    torch.manual_seed(seed)
    loss = module(x, labels)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in module.parameters()], torch.get_rng_state()


def _same(a, b) -> bool:
    (loss, grads, state), (loss2, grads2, state2) = a, b
    return torch.equal(loss, loss2) and torch.equal(state, state2) and all(map(torch.equal, grads, grads2))


@pytest.fixture(scope="module")
def branching():
    torch.manual_seed(0)
    model = Branching()
    x = torch.randn(8, WIDTH)
    return model, x, torch.tensor([1, 2, 3, 4, 5, 1, 2, 3])


@settings(max_examples=12, deadline=None)
@given(labels=st.lists(st.integers(0, CLASSES - 1), min_size=8, max_size=8))
def test_each_call_takes_the_branch_its_inputs_take_in_eager(branching, labels):
    """Searched over label vectors: with and without a 0 among them, under a schedule that
    recomputes at random, every step is eager's bitwise (loss, gradients, generator)."""
    model, x, example = branching
    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, (x, example), budget=None, cost_model="flops")
    labels = torch.tensor(labels)
    assert _same(_step(scheduled, x, labels), _step(eager, x, labels))
    plan_count = 2 if (labels == 0).any() else 1   # the other branch of `labels == 0` planned once
    assert len(scheduled.plans) == plan_count


def test_the_branch_taken_is_recorded_checked_and_said(branching):
    model, x, example = branching
    graph = lower_torch(model, (x, example), cost_model="flops")
    guards = [g for g in __import__("json").loads(graph.proto.metadata["torch.value_guards"])]
    assert [(g["decision"], g["answer"]) for g in guards] == [("builtins.bool", False), ("builtins.bool", True),
                                                              ("builtins.bool", False)]
    assert all("test_input_branches.py" in g["line"] for g in guards)
    # Any valid schedule runs the branch it was lowered for, bitwise.
    import random
    schedule = random_schedule(graph, random.Random(3), recompute_share=0.8)
    eager = copy.deepcopy(model)
    assert _same(_step(ScheduledModule(model, graph, schedule), x, example), _step(eager, x, example))
    # Without a planner, a call whose values take the other branch is refused by name.
    with pytest.raises(RuntimeInputError, match=r"condition at .*test_input_branches.py:\d+ in forward True, "
                                                r"where those it was lowered with made it False"):
        ScheduledModule(model, graph, schedule)(x, torch.tensor([0, 1, 2, 3, 4, 5, 1, 2]))


@pytest.mark.parametrize("labels", [[1, 2, 3, 4, 5, 6, 1, 2], [1, 2, 3, 4, 5, -1, 1, 2]])
def test_a_call_whose_values_eager_refuses_raises_eagers_error(branching, labels):
    """Eager's own exception, type and message (a `LoweringError` before: a training loop
    catching the model's ValueError to skip a bad batch met another type), with a note
    saying it was raised where remat-ir traced the forward for these values."""
    model, x, example = branching
    scheduled = remat_ir.remat(model, (x, example), budget=None, cost_model="flops")
    with pytest.raises((ValueError, AssertionError)) as eager:
        copy.deepcopy(model)(x, torch.tensor(labels))
    with pytest.raises(eager.type) as ours:
        scheduled(x, torch.tensor(labels))
    # The first line: pytest's assertion rewriting adds what each side's operands were.
    assert str(ours.value).splitlines()[0] == str(eager.value).splitlines()[0]
    assert any("to plan this call's new input values" in note for note in ours.value.__notes__)
    # The calls eager runs still train as eager.
    assert _same(_step(scheduled, x, example), _step(copy.deepcopy(model), x, example))


class ReadsItsWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        h = self.a(x)
        if self.a.weight.abs().max() > 10:    # changes as the model trains: no graph can hold it
            h = h / 10
        return h.sum()


class ReadsANumber(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, scale):
        return (self.a(x) * scale.max().item()).sum()   # a number, not a truth: not recorded


class ReadsAnAliasOfItsWeights(nn.Module):
    """A plain attribute sharing a parameter's storage through `.data` (its own version
    counter: an optimizer's step is not seen on it). Its truth was computed once and
    never checked again: after `weight.neg_()`, eager -0.6256, remat-ir +0.6256."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(WIDTH, WIDTH)
        self.held = self.a.weight.data

    def forward(self, x):
        h = self.a(x)
        return h.sum() if self.held.sum() > 0 else -h.sum()


class WritesItsInputFirst(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, y):
        y.add_(1)   # replayed to decide, it wrote into the caller's example tensor
        return self.a(x).sum() if (y > 0).all() else -self.a(x).sum()


@pytest.mark.parametrize("make, inputs", [
    (ReadsItsWeights, lambda: (torch.randn(4, WIDTH),)),
    (ReadsANumber, lambda: (torch.randn(4, WIDTH), torch.rand(3))),
    (ReadsAnAliasOfItsWeights, lambda: (torch.randn(4, WIDTH),)),
    (WritesItsInputFirst, lambda: (torch.randn(4, WIDTH), torch.tensor([0.5, 0.5]))),
])
def test_a_truth_read_from_the_models_tensors_or_a_number_read_from_data_stays_refused(make, inputs):
    before = {name: torch.Tensor.__dict__.get(name) for name in ("__bool__", "item")}
    example = inputs()
    kept = [t.clone() for t in example]
    with pytest.raises(LoweringError, match="tensor data|depends on tensor data|writes into"):
        lower_torch(make(), example, cost_model="flops")
    assert all(map(torch.equal, example, kept))   # deciding wrote into no input
    # Tracing put torch.Tensor back as it was.
    assert {name: torch.Tensor.__dict__.get(name) for name in ("__bool__", "item")} == before
    assert bool(torch.tensor(True)) is True and torch.tensor(3).item() == 3


class MakesItsMask(nn.Module):
    """Longformer's way: a mask of ones made from the input's shape where the caller passed
    none, compared with a constant, and its truth read with `.item()` (under export's
    torch-function modes, which call the method again by name)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        mask = torch.ones(x.shape[:1])
        if (mask > torch.tensor(1.0)).flatten().any().item():
            x = x * 0
        return torch.tanh(self.a(x)).sum()


def test_a_truth_computed_from_shapes_alone_is_computed_and_not_checked_per_call():
    torch.manual_seed(0)
    model, x = MakesItsMask(), torch.randn(4, WIDTH)
    graph = lower_torch(model, (x,), cost_model="flops")
    assert "torch.value_guards" not in graph.proto.metadata or \
        graph.proto.metadata["torch.value_guards"] in ("", "[]")
    eager = copy.deepcopy(model)
    for module in (ScheduledModule(model, graph, ir_store_all(graph)), eager):
        module(x).backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), eager.parameters()))
    assert eager.a.weight.grad.abs().sum() > 0   # the branch not taken would zero it
