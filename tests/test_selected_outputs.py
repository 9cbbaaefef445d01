"""`remat(..., outputs=[...])`: a training step that returns some of the model's outputs
(`frontends/selected_outputs.py`). What it returns is eager's, bitwise, with None for
the outputs left out; those are planned as intermediates, so the floor falls (a language
model's logits) and every plan measures the peak it simulates."""

from __future__ import annotations

import collections
import random

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import remat_ir
from remat_ir import ir, solvers
from remat_ir.frontends.errors import LoweringError
from remat_ir.ir import RematIRError
from remat_ir.ir.schedules import store_all
from remat_ir.lowering import lower_torch
from remat_ir.runtimes.memory import measure_peak
from remat_ir.runtimes.torch import ScheduledModule

from exactness import random_round_trips, random_schedule, side_by_side
from random_networks import RandomNet, output_values, programs
from strategies import search
from torch_models import gpt2


class Returning(torch.nn.Module):
    """`model` as eager's side of a comparison: its outputs with None for those not in
    `kept` (a dict's or a ModelOutput's by name, a tuple's by position), which is what a step
    planned for `outputs=kept` returns. Its parameters are the model's, in its order."""

    def __init__(self, model: torch.nn.Module, kept):
        super().__init__()
        self.model, self.kept = model, set(kept)

    def forward(self, *args, **kwargs):
        out = self.model(*args, **kwargs)
        if isinstance(out, tuple):
            return tuple(o if i in self.kept else None for i, o in enumerate(out))
        for name in list(out.keys()):
            if name not in self.kept:
                out[name] = None
        return out


def _gpt2_step(scheduled, kwargs):
    """One step trained on `.loss`, the caller holding what the step returned until the
    backward ends (the plan counts it so)."""
    def step():
        out = scheduled(**kwargs)
        out.loss.backward()
    return step


@pytest.mark.parametrize("solver", ["recompute-all", "hiremate"])
def test_gpt2_trained_on_its_loss_alone_is_eagers_bitwise_with_no_logits(solver):
    """Three steps with dropout: loss, gradients and generator state eager's; the logits
    None in what the step returns (eager's model with its logits left out is the
    reference); `model.eval()` runs the model as it is, logits included."""
    model, _, kwargs, _ = gpt2()
    errors = side_by_side(Returning(model, ["loss"]),
                          lambda m: remat_ir.remat(m.model, kwargs, budget=0.7 if solver == "hiremate" else None, solver=solver,
                                                   cost_model="flops", outputs=["loss"]),
                          (), kwargs, lambda out: out.loss, steps=3)
    assert errors == {}, errors
    scheduled = remat_ir.remat(model, kwargs, budget=0.7, cost_model="flops", outputs="loss")
    out = scheduled(**kwargs)
    assert out.logits is None and list(out.keys()) == ["loss"]
    model.eval()
    assert scheduled(**kwargs).logits.shape == (2, 16, 128)


def test_leaving_the_logits_out_lowers_the_floor_and_each_plan_measures_its_peak():
    """The logits (the step's largest activation here) are no longer pinned to the end of
    the step: the smallest feasible budget falls below the one with them returned, and
    each plan's measured peak is its simulated one (FLOP costs: sizes are real)."""
    model, _, kwargs, _ = gpt2(n_layer=1)
    floors, graphs = {}, {}
    for outputs in (None, ["loss"]):
        graph = lower_torch(model, (), example_kwargs=kwargs, cost_model="isolated", outputs=outputs)
        try:
            solvers.solve(graph, 1, "hiremate", time_limit_s=5)
        except solvers.InfeasibleBudget as refused:
            floors[outputs is None] = refused.smallest_feasible
        graphs[outputs is None] = graph
    assert floors[False] < floors[True], floors
    graph = graphs[False]
    whole = ir.simulate(graph, store_all(graph)).peak_bytes
    for budget in (floors[False], (floors[False] + whole) // 2):
        schedule = solvers.solve(graph, budget, "hiremate", time_limit_s=5)
        simulated = ir.simulate(graph, schedule).peak_bytes
        scheduled = ScheduledModule(model, graph, schedule)
        for _ in range(2):   # the second step: the first makes its code
            scheduled.zero_grad(set_to_none=True)
            measured = measure_peak(_gpt2_step(scheduled, kwargs), "cpu").peak_bytes
        assert simulated <= budget
        assert abs(measured - simulated) <= 64, (budget, measured, simulated)


class _Heads(torch.nn.Module):
    """Three heads of one layer, returned as `kind` (a dict, a tuple, a namedtuple)."""

    Out = collections.namedtuple("Out", "loss aux extra")

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.linear = torch.nn.Linear(8, 8)
        self.dropout = torch.nn.Dropout(0.3)

    def forward(self, x):
        h = self.dropout(torch.tanh(self.linear(x)))
        loss, aux, extra = h.pow(2).mean(), h * 2, h.sum(0)
        if self.kind == "dict":
            return {"loss": loss, "aux": aux, "extra": extra}
        if self.kind == "tuple":
            return loss, aux, extra
        return self.Out(loss, aux, extra)


@pytest.mark.parametrize("kind,outputs,returned", [
    ("dict", ["loss", "extra"], {"loss": True, "aux": False, "extra": True}),
    ("tuple", [0, -1], [True, False, True]),
    ("namedtuple", ["loss", 2], [True, False, True]),
])
def test_dicts_tuples_and_namedtuples_keep_their_structure_with_none_left_out(kind, outputs, returned):
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    model = _Heads(kind)
    scheduled = remat_ir.remat(model, (x,), solver="recompute-all", cost_model="flops", outputs=outputs)
    out = scheduled(x)
    assert type(out) is type(model(x))
    present = ({k: v is not None for k, v in out.items()} if kind == "dict"
               else [v is not None for v in out])
    assert present == returned
    kept = [k for k, v in (returned.items() if kind == "dict" else enumerate(returned)) if v]
    torch.manual_seed(0)
    errors = side_by_side(Returning(_Heads(kind), kept),
                          lambda m: remat_ir.remat(m.model, (x,), solver="recompute-all",
                                                   cost_model="flops", outputs=outputs),
                          (x,), {}, lambda out: out[0] if kind != "dict" else out["loss"], steps=2)
    assert errors == {}, errors


@pytest.mark.parametrize("outputs,said", [
    (["logits", "hidden"], "no output named 'hidden'"),
    ([3], "no output at position 3"),
    ([], "a non-empty list"),
    ([True], "a name or a position"),
    ([1.5], "a name or a position"),
])
def test_a_bad_selection_is_one_clear_error(outputs, said):
    model, _, kwargs, _ = gpt2(n_layer=1)
    with pytest.raises(RematIRError, match="outputs") as raised:
        remat_ir.remat(model, kwargs, cost_model="flops", outputs=outputs)
    assert said in str(raised.value)
    if "named" in said:   # the names it has, so that the user can pick one
        assert "['loss', 'logits']" in str(raised.value)


def test_one_tensor_or_no_tensor_selected_is_refused():
    x = torch.randn(4, 8)
    with pytest.raises(LoweringError, match="returns one tensor"):
        lower_torch(torch.nn.Linear(8, 8), (x,), cost_model=None, outputs=[0])

    class WithCount(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.linear(x).sum(), 3

    with pytest.raises(LoweringError, match="selects no tensor"):
        lower_torch(WithCount(), (x,), cost_model=None, outputs=[1])

    class LossWithLabels(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x, labels=None):
            logits = self.linear(x)
            return {"loss": None if labels is None else (logits - labels).square().mean(), "logits": logits}

    # A call without labels has no loss (found by a review: the advice was to select it).
    with pytest.raises(LoweringError, match=r"selects no tensor among LossWithLabels's outputs for these inputs "
                                            r"\(the output is None: a loss without labels\?\)"):
        lower_torch(LossWithLabels(), (x,), cost_model=None, outputs=["loss"])


class _LossWhenLabelled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x, labels=None):
        logits = torch.tanh(self.linear(x))
        return {"loss": None if labels is None else (logits - labels).square().mean(), "logits": logits}


def test_a_later_call_returning_none_of_the_selected_outputs_returns_every_output(capsys):
    """Found by hunt64: Trainer's label smoothing pops the labels and computes the loss
    from the logits, and with `outputs=["loss"]` (which the README advises for Trainer)
    that call was refused. Its signature is planned with every output now, training like
    eager; a first call selecting nothing is still refused."""
    torch.manual_seed(0)
    x, labels = torch.randn(4, 8), torch.randn(4, 8)
    with pytest.raises(LoweringError, match="selects no tensor"):
        remat_ir.remat(_LossWhenLabelled(), (x,), outputs=["loss"], cost_model="flops")
    model = _LossWhenLabelled()
    scheduled = remat_ir.remat(model, (x,), example_kwargs={"labels": labels}, outputs=["loss"], cost_model="flops",
                               solver="recompute-all")
    scheduled(x, labels=labels)["loss"].backward()
    model.zero_grad()
    capsys.readouterr()
    assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda out: out["logits"].square().mean(),
                        tolerance=1e-30) == {}
    assert "outputs=['loss'] selects no output this call returns" in capsys.readouterr().err


@search(10, derandomize=True)
@given(program=programs(), seed=st.integers(0, 2**32 - 1), offload=st.booleans(), data=st.data())
def test_random_networks_returning_some_heads_are_exact_and_peak_where_simulated(program, seed, offload, data):
    """Random networks (`random_networks`) returning a random part of their heads, under
    random schedules (with random offloads): bitwise eager's with the others left out,
    generator state included; and the measured peak at most the simulated one (within
    0.5% or 64 B: a masked assignment's workspace varies with its mask)."""
    heads = output_values(program)
    assume(len(heads) >= 2)
    trained = next(i for i, v in enumerate(heads) if program[v - 1][0] == "linear")
    others = [i for i in range(len(heads)) if i != trained]
    kept = sorted({trained, *data.draw(st.lists(st.sampled_from(others), max_size=len(others) - 1,
                                                 unique=True))})
    width = 6
    torch.manual_seed(0)
    x = torch.randn(3, width)
    graph = lower_torch(RandomNet(program, width, heads=True), (x,), cost_model="isolated", outputs=kept)
    rnd = random.Random(seed)
    schedule = random_schedule(graph, rnd, recompute_share=0.5, defer_share=0.5)
    if offload:
        schedule = random_round_trips(graph, schedule, rnd, share=0.5)
    loss = lambda out: sum((out[i] * out[i]).sum() for i in kept)  # noqa: E731
    torch.manual_seed(0)
    model = RandomNet(program, width, heads=True)
    errors = side_by_side(Returning(model, kept), lambda m: ScheduledModule(m.model, graph, schedule),
                          (x,), {}, loss, steps=2)
    assert errors == {}, f"not bitwise equal to eager: {errors}"
    scheduled = ScheduledModule(model, graph, schedule)
    # Dense gradients made before the step: a loss computed after it allocates outside
    # the plan, and a sum's expanded gradient makes a matrix product copy it.
    trained_heads = [i for i, o in enumerate(scheduled(x)) if i in kept and o.requires_grad]
    given_gradients = [torch.randn(scheduled(x)[i].shape) for i in trained_heads]

    def step():
        out = scheduled(x)
        torch.autograd.backward([out[i] for i in trained_heads], given_gradients)
    for _ in range(2):
        scheduled.zero_grad(set_to_none=True)
        measured = measure_peak(step, "cpu").peak_bytes
    simulated = ir.simulate(graph, schedule).peak_bytes
    assert measured <= simulated + max(64, simulated // 200), (measured, simulated)


def test_a_loss_leaving_outputs_out_is_told_once_how_to_let_the_plan_free_them(capsys):
    """The first backward whose loss gives an output no gradient says so once per module,
    with the output's size and the `outputs=` that would let the plan free it (by name
    for a ModelOutput, by position for a tuple); with that selection, nothing is said."""
    model, _, kwargs, _ = gpt2(n_layer=1)
    scheduled = remat_ir.remat(model, kwargs, solver="recompute-all", cost_model="flops")
    for _ in range(2):
        scheduled(**kwargs).loss.backward()
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("remat-ir:")]
    assert said == ["remat-ir: the loss gives no gradient to output['logits'] (16.00 KiB), which the step "
                    "returns, so the plan keeps it to the end of every step (the caller may hold it); if "
                    "no call's loss reads it (a step calling the model twice may read it in the other "
                    "call), pass remat(..., outputs=['loss']) and the plan may free or recompute it"]
    selected = remat_ir.remat(model, kwargs, solver="recompute-all", cost_model="flops", outputs=["loss"])
    selected(**kwargs).loss.backward()
    assert "no gradient" not in capsys.readouterr().err
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    heads = remat_ir.remat(_Heads("tuple"), (x,), solver="recompute-all", cost_model="flops")
    heads(x)[0].backward()
    said = capsys.readouterr().err
    assert "no gradient to output[1], output[2] (160 B)" in said and "outputs=[0]" in said


class _Nested(torch.nn.Module):
    """A loss and a pair of heads in one top-level output: selecting cannot leave one out."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.linear(x)
        return h.square().mean(), (h * 2, h.sum(0))


def test_the_notice_suggests_a_selection_only_where_it_would_leave_the_output_out(capsys):
    x = torch.randn(4, 8)
    scheduled = remat_ir.remat(_Nested(), (x,), solver="recompute-all", cost_model="flops")
    out = scheduled(x)
    (out[0] + out[1][0].sum()).backward()
    said = capsys.readouterr().err
    assert "no gradient to output[1][1] (32 B)" in said
    assert "return only what the loss reads" in said and "outputs=" not in said


class _Twice(torch.nn.Module):
    """Returns one tensor twice, and a head beside it."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.linear(x)
        return h, h, h.sum(0)


def test_a_tensor_returned_twice_that_the_loss_reads_is_not_told_as_unread(capsys):
    """Its gradient arrives at one of its positions: found by a review, the notice named the
    other as given no gradient and advised leaving it out, though the loss read it. A head
    the loss does not read is still told."""
    x = torch.randn(4, 8)
    scheduled = remat_ir.remat(_Twice(), (x,), solver="recompute-all", cost_model="flops")
    out = scheduled(x)
    (out[0].sum() + out[1].square().sum()).backward()
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("remat-ir:")]
    assert len(said) == 1 and "no gradient to output[2] (32 B)" in said[0], said
