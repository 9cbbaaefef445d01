"""Checks on tensor values a forward makes run at every step, as eager runs them.

`F.one_hot` (traced through PyTorch's Python version) checks that the classes are in
range with `_assert_async`, and so may a user's forward (`torch._assert_async`). Lowering
dropped those ops, so a batch eager refuses trained on silently: a label 7 of 5 classes
became an all-zero row of the target. Each is now a `remat_ir.value_check` node whose
empty result is a VALUE_CHECK output (`torchlib/value_checks.py`). So are the checks of
`torch.linalg`'s checked ops (refused before), and branches on values that only raise
(`frontends/raising_checks.py`: refused before), and PyTorch's `torch._check_tensor_all`
on traced tensors (`frontends/tensor_checks.py`: refused before).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import _check_tensor_all_with as _held_check   # a reference taken before lowering

import remat_ir
from remat_ir import ir
from remat_ir.ir import pb
from torch_models import Guarded
from transformers.models.llava import modeling_llava


class _OneHotTargets(torch.nn.Module):
    """Label smoothing written by hand with `one_hot`, and a check of the inputs' range
    (`torch._assert_async`, without a message and with one) on the input and on an
    activation."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 16)
        self.head = torch.nn.Linear(16, 5)
        self.drop = torch.nn.Dropout(0.2)

    def forward(self, x, labels):
        torch._assert_async((x.abs() < 100).all())
        h = self.drop(torch.tanh(self.lin(x)))
        torch._assert_async(torch.isfinite(h).all(), "hidden states are not finite")
        target = torch.nn.functional.one_hot(labels, 5).float() * 0.9 + 0.02
        return -(target * self.head(h).log_softmax(-1)).sum(-1).mean()


def _step(model, *inputs):
    torch.manual_seed(7)
    loss = model(*inputs)
    loss.backward()
    return loss


@pytest.mark.parametrize("plan", [dict(solver="autograd"), dict(solver="recompute-all"),
                                  dict(budget=0.9, time_limit_s=5)], ids=["autograd", "recompute-all", "hiremate"])
def test_value_checks_raise_as_eagers_do_and_good_batches_train_bitwise(plan):
    torch.manual_seed(0)
    model, x = _OneHotTargets(), torch.randn(6, 8)
    labels = torch.tensor([0, 1, 2, 3, 4, 0])
    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, (x, labels), cost_model="flops", cache_dir=False, **plan)
    checks = [o for o in scheduled.graph.proto.outputs if o.role == pb.VALUE_CHECK]
    assert len(checks) == 4   # one_hot's two, and the forward's own two
    assert ir.simulate(scheduled.graph, scheduled.schedule).valid

    bad = [((x, torch.tensor([0, 1, 7, 3, 4, 0])), "Class values must be smaller than num_classes"),
           ((x, torch.tensor([0, -1, 2, 3, 4, 0])), "Class values must be non-negative"),
           ((x * 1e3, labels), "Expected Tensor with single nonzero value, but got zero"),
           ((x.masked_fill(x > 1, float("nan")), labels), None)]   # nan: x.abs() < 100 is false too
    for inputs, message in bad:
        with pytest.raises(RuntimeError) as eager_error:
            _step(eager, *inputs)
        with pytest.raises(RuntimeError) as error:
            _step(scheduled, *inputs)
        assert message is None or message in str(eager_error.value) and message in str(error.value)
    eager.zero_grad(), model.zero_grad()
    for _ in range(2):   # a refused batch leaves nothing behind: the next steps are eager's
        assert torch.equal(_step(eager, x, labels), _step(scheduled, x, labels))
    for (name, a), b in zip(eager.named_parameters(), model.parameters()):
        assert torch.equal(a.grad, b.grad), name


def test_a_value_check_survives_a_file_and_every_schedule_keeps_it(tmp_path):
    """The check's node and output are in the IR file as lowered, and plans of every
    built-in solver that plans this graph run it in the forward, where it was."""
    from remat_ir import solvers
    from remat_ir.lowering import lower_torch

    torch.manual_seed(0)
    graph = lower_torch(_OneHotTargets(), (torch.randn(6, 8), torch.tensor([0, 1, 2, 3, 4, 0])),
                        cost_model="flops")
    path = tmp_path / "checked.rir"
    ir.save(graph, path)
    again = ir.load(path)
    checkers = [n.id for n in again.proto.nodes if n.op == "remat_ir.value_check.default"]
    assert len(checkers) == 4 and all(again.node(n).phase == pb.FORWARD for n in checkers)
    peak = ir.store_all(again).predicted_peak_bytes
    for solver in ("checkmate", "rotor", "twremat", "fastsa", "sqrt", "recompute-all"):
        try:
            schedule = solvers.solve(again, int(peak * 0.9), solver, time_limit_s=5)
        except solvers.InfeasibleBudget as refused:
            schedule = refused.schedule
        forward = [s.compute for s in schedule.steps[:schedule.backward_start] if s.HasField("compute")]
        assert all(n in forward for n in checkers), solver
        assert ir.simulate(again, schedule).valid, solver


@pytest.mark.parametrize("seed", range(4))
def test_random_schedules_run_the_checks_and_train_bitwise(seed):
    """Random valid schedules (the tests' `random_schedule`, which families.py also runs)
    that defer and recompute what they may: the checks run in the forward and a bad batch
    raises; the good steps are eager's bits. (The generator left value checks out of the
    forward's outputs: its schedules of LLaVA were invalid.)"""
    import random

    from exactness import random_schedule, side_by_side
    from remat_ir.lowering import lower_torch
    from remat_ir.runtimes.torch import ScheduledModule

    torch.manual_seed(0)
    x, labels = torch.randn(6, 8), torch.tensor([0, 1, 2, 3, 4, 0])
    model = _OneHotTargets()
    graph = lower_torch(copy.deepcopy(model), (x, labels), cost_model="flops")
    schedule = random_schedule(graph, random.Random(seed), recompute_share=0.5, defer_share=0.5)
    assert ir.simulate(graph, schedule).valid
    errors = side_by_side(model, lambda m: ScheduledModule(m, graph, schedule), (x, labels), {},
                          lambda loss: loss, steps=2)
    assert errors == {}
    with pytest.raises(RuntimeError, match="Class values must be smaller than num_classes"):
        ScheduledModule(copy.deepcopy(model), graph, schedule)(x, torch.tensor([0, 1, 7, 3, 4, 0]))


class _LinearAlgebra(torch.nn.Module):
    """`torch.linalg`'s checked ops, which raise on a singular (or, for Cholesky, not
    positive-definite) input: traced, each is its `_ex` form and `_linalg_check_errors`
    on its `info`, an op AOTAutograd orders with an effect token; lowering refused them
    ("use their unchecked forms"), and PyTorch's orthogonal parametrization with it."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.rotation = torch.nn.utils.parametrizations.orthogonal(torch.nn.Linear(4, 4),
                                                                   orthogonal_map="cayley")

    def forward(self, x, shift):
        a = self.lin(x).reshape(-1, 4, 4) + shift * torch.eye(4)
        b = torch.linalg.inv(a)
        c = torch.linalg.solve(a, self.rotation(b)[..., :1])
        lower = torch.linalg.cholesky(a @ a.mT + shift * torch.eye(4))
        return b.sum() + c.square().sum() + lower.sum()


@pytest.mark.parametrize("solver", ["autograd", "recompute-all"])
def test_checked_linear_algebra_trains_bitwise_and_raises_eagers_error(solver):
    torch.manual_seed(0)
    model, x, shift = _LinearAlgebra(), torch.randn(8, 4), torch.tensor(4.0)
    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, (x, shift), solver=solver, cost_model="flops", cache_dir=False)
    assert sum(n.op == "remat_ir.linalg_check.default" for n in scheduled.graph.proto.nodes) >= 3
    singular = (torch.zeros(8, 4), torch.tensor(0.0))   # a = the bias in every row: rank 1
    with pytest.raises(torch.linalg.LinAlgError) as eager_error:
        eager(*singular)
    with pytest.raises(torch.linalg.LinAlgError) as error:
        scheduled(*singular)
    assert str(error.value) == str(eager_error.value)   # "linalg.inv: (Batch element 0): ..."
    torch.manual_seed(0)
    for p in (*model.parameters(), *eager.parameters()):
        p.data.copy_(torch.randn_like(p) * 0.1)
    eager.load_state_dict(model.state_dict())
    for _ in range(2):
        assert torch.equal(_step(eager, x, shift), _step(scheduled, x, shift))
    for (name, a), b in zip(eager.named_parameters(), model.parameters()):
        assert torch.equal(a.grad, b.grad), name


class _Eigenvalues(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w, self.linear = torch.nn.Parameter(torch.randn(6, 6)), torch.nn.Linear(6, 6)

    def forward(self, x):
        return torch.linalg.eigvals(self.w).real.sum() + self.linear(x).mean()


def test_a_check_in_an_ops_backward_is_refused_naming_the_line():
    """`eigvals` of a parameter: its derivative checks a matrix through torch.linalg's
    error check, which the graph runs in the forward only. Refused as the forward's call
    of `aten._linalg_check_errors`, an op the user never wrote (found by a review); now
    as the backward's, with the model's line."""
    from remat_ir.frontends.errors import LoweringError

    with pytest.raises(LoweringError, match=r"_Eigenvalues's backward checks a matrix for "
                       r"singularity .*eig or eigvals, at .*test_value_checks.py:\d+ in forward\), which"):
        remat_ir.remat(_Eigenvalues(), (torch.randn(4, 6),), solver="recompute-all", cost_model="flops",
                       cache_dir=False)


class _Heteroscedastic(torch.nn.Module):
    """A regression head predicting a mean and a variance, trained by `nn.GaussianNLLLoss`,
    whose check of the variance (`if torch.any(var < 0): raise ValueError`) is a branch on
    values: refused before ("checks that the variance is not negative at every call")."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Dropout(0.1))
        self.mean, self.var = torch.nn.Linear(16, 1), torch.nn.Linear(16, 1)
        self.loss = torch.nn.GaussianNLLLoss()

    def forward(self, x, y, shift):
        h = self.body(x)
        return self.loss(self.mean(h), y, torch.nn.functional.softplus(self.var(h)) - shift)


@pytest.mark.parametrize("solver", ["autograd", "recompute-all"])
def test_gaussian_nll_loss_of_a_learned_variance_trains_bitwise_and_raises_eagers_value_error(solver):
    torch.manual_seed(0)
    model, x, y, shift = _Heteroscedastic(), torch.randn(16, 8), torch.randn(16, 1), torch.tensor(0.0)
    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, (x, y, shift), solver=solver, cost_model="flops", cache_dir=False)
    assert [n.op for n in scheduled.graph.proto.nodes if "check" in n.op] == ["remat_ir.value_check.default"]
    for module in (eager, scheduled):   # a variance below zero
        with pytest.raises(ValueError, match="var has negative entry/entries"):
            module(x, y, torch.tensor(5.0))
    for _ in range(2):
        assert torch.equal(_step(eager, x, y, shift), _step(scheduled, x, y, shift))
    for (name, a), b in zip(eager.named_parameters(), model.parameters()):
        assert torch.equal(a.grad, b.grad), name


@pytest.mark.parametrize("kind, bad, error, message", [
    ("nan guard", float("nan"), RuntimeError, "the loss is NaN"),
    ("assert", 1e4, AssertionError, "activations exploded"),
    ("assert not", 1e4, AssertionError, None),
    ("assert item", 1e4, AssertionError, "activations exploded"),
    ("computed message", 1e4, ValueError, None)])
def test_a_branch_that_only_raises_is_a_check_of_every_step(kind, bad, error, message):
    """`frontends/raising_checks.py`: the trace takes the computing side; the step raises
    eager's exception, with eager's message where the statement gives it whole. (The
    model lives in `torch_models.py`, whose asserts pytest does not rewrite.)"""
    torch.manual_seed(0)
    model, x = Guarded(kind), torch.randn(4, 8)
    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, (x,), solver="recompute-all", cost_model="flops", cache_dir=False)
    for module in (eager, scheduled):
        with pytest.raises(error) as raised:
            module(x * bad)
        if message is not None:
            assert str(raised.value) == message
    assert torch.equal(_step(eager, x), _step(scheduled, x))
    for a, b in zip(eager.parameters(), model.parameters()):
        assert torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("kind", ["computes on both sides", "one operand of or"])
def test_a_branch_on_values_that_is_not_only_a_raise_is_still_refused(kind):
    from remat_ir.frontends.errors import LoweringError

    with pytest.raises(LoweringError, match="branches on a value computed from tensor data"):
        remat_ir.remat(Guarded(kind), (torch.randn(4, 8),), solver="autograd", cost_model="flops",
                       cache_dir=False)


class _CheckedTensors(torch.nn.Module):
    """PyTorch's tensor checks: on an activation (with a message, a message computed from
    values, an exception type, none), on the inputs, and transformers' check."""

    def __init__(self, kind: str):
        super().__init__()
        self.lin, self.kind = torch.nn.Linear(4, 4), kind

    def forward(self, ids, x):
        h = torch.nn.functional.dropout(self.lin(x), 0.3)
        if self.kind == "message":
            torch._check_tensor_all(h.abs() < 50, lambda: "activations exploded")
        elif self.kind == "no message":
            torch._check_tensor_all((h.abs() < 50).all())
        elif self.kind == "computed message":
            torch._check_tensor_all_with(ValueError, h.abs() < 50, lambda: f"max {h.abs().max()}")
        elif self.kind == "not a callable":
            torch._check_tensor_all(h.abs() < 50, "activations exploded")
        elif self.kind == "inputs":
            torch._check_tensor_all((ids >= 0).sum() == ids.numel(), lambda: "negative ids")
        elif self.kind == "message reading the inputs":   # a decision on them: a plan per call
            torch._check_tensor_all(ids >= 0, lambda: "negative ids" if (ids < 0).any() else "?")
        elif self.kind == "transformers":   # as LLaVA's models call it (imported with the model)
            modeling_llava.torch_compilable_check(h.abs().amax() < 50, "activations exploded")
        return h.square().sum()


@pytest.mark.parametrize("kind, error, message", [
    ("message", RuntimeError, "activations exploded"),
    ("no message", RuntimeError, "Expected cond to be True, but got False"),
    ("computed message", ValueError, "max "),
    ("not a callable", TypeError, "message must be a callable"),
    ("inputs", RuntimeError, "negative ids"),
    ("message reading the inputs", RuntimeError, "negative ids"),
    ("transformers", ValueError, "activations exploded")])
def test_pytorchs_tensor_checks_run_at_every_step_as_eagers(kind, error, message):
    """`frontends/tensor_checks.py`: `torch._check_tensor_all` on an activation was refused
    (a value read), on the inputs alone taken as a decision of the call, so a failing call
    was planned again and refused with a LoweringError; transformers' own check raised
    PyTorch's RuntimeError where eager raises ValueError with the model's message. A
    message computed from tensors, which the graph cannot compute, is eager's too: a
    failing step runs the model's forward as it is in its place."""
    torch.manual_seed(0)
    ids, x = torch.arange(6).view(2, 3), torch.randn(3, 4)
    model = _CheckedTensors(kind)
    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, (ids, x), solver="recompute-all", cost_model="flops", cache_dir=False)
    assert [o.role for o in scheduled.graph.proto.outputs].count(pb.VALUE_CHECK) == 1
    bad = (ids - 3, x) if "inputs" in kind else (ids, x * 1e3)
    with pytest.raises(error) as eager_error:
        _step(eager, *bad)
    with pytest.raises(error) as raised:
        _step(scheduled, *bad)
    assert message in str(raised.value)
    assert str(raised.value) == str(eager_error.value)   # eager's message word for word
    eager.zero_grad(), model.zero_grad()
    for _ in range(2):   # dropout draws as eager's after the refused batch
        assert torch.equal(_step(eager, ids, x), _step(scheduled, ids, x))
    for a, b in zip(eager.parameters(), model.parameters()):
        assert torch.equal(a.grad, b.grad)
    assert len(scheduled.plans) == 1   # no call was planned again


class _Unstable(Exception):
    pass


class _ChecksWith(torch.nn.Module):
    """A tensor check raising `error`, through torch's function or a reference to it taken
    at import (`held`)."""

    def __init__(self, held, error):
        super().__init__()
        self.lin, self.held, self.error = torch.nn.Linear(4, 4), held, error

    def forward(self, x):
        h = self.lin(x)
        (_held_check if self.held else torch._check_tensor_all_with)(self.error, h.isfinite(), None)
        return h.sum()


@pytest.mark.parametrize("held, error, words", [
    # The op raises built-in exceptions only: a user's class is refused by name.
    (False, _Unstable,
     r"checks a tensor condition at .*test_value_checks.py:\d+ in forward .*_Unstable"),
    # The one form `tensor_checks.py` cannot reach (it replaces the function in torch while
    # tracing): refused as a check on values, saying to call torch's at the call site.
    (True, RuntimeError,
     r"checks a condition on tensor values at .*test_value_checks.py:\d+ in forward through a reference")],
    ids=["users exception", "reference taken before lowering"])
def test_a_tensor_check_remat_ir_cannot_run_is_refused_by_name(held, error, words):
    from remat_ir.frontends.errors import LoweringError

    with pytest.raises(LoweringError, match=rf"_ChecksWith's forward {words}"):
        remat_ir.remat(_ChecksWith(held, error), (torch.randn(3, 4),), solver="autograd", cost_model="flops",
                       cache_dir=False)


class _NotProbabilities(Exception):
    """A check's own exception class, as a user's custom op may raise."""


@torch.library.custom_op("remat_ir_tests::checked_probabilities", mutates_args=())
def _checked_probabilities(p: torch.Tensor) -> torch.Tensor:
    """A custom op checking its input's values, true of every batch it is given (a
    softmax's output), false of the values profiling draws."""
    if not bool((p >= 0).all()):
        raise _NotProbabilities("probabilities must be non-negative")
    return p.clone()


@_checked_probabilities.register_fake
def _(p):
    return torch.empty_like(p)


_checked_probabilities.register_autograd(lambda ctx, grad: grad)


class _ChecksProbabilities(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return _checked_probabilities(torch.softmax(self.fc(x), -1)).square().sum()


@pytest.mark.parametrize("cost_model", ["profile", "isolated"])
@pytest.mark.parametrize("how", ["assert", "custom op"])
def test_checks_plan_under_cost_models_that_run_ops_on_drawn_values(how, cost_model):
    """Found by reviews: timing an op alone on drawn values, a check false of them (the
    README's `assert (h.abs() < 50).all()`, a custom op's own `assert` or exception class)
    raised out of `remat` with eager's message, as if the batch had failed it; such an
    op's time is now estimated. (Every other test of checks here uses the "flops" cost
    model.)"""
    torch.manual_seed(0)
    model, x = (Guarded("assert") if how == "assert" else _ChecksProbabilities()), torch.randn(4, 8)
    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, (x,), solver="recompute-all", cost_model=cost_model, cache_dir=False)
    assert torch.equal(_step(eager, x), _step(scheduled, x))
    for a, b in zip(eager.parameters(), model.parameters()):
        assert torch.equal(a.grad, b.grad)


class _CountsLoad(torch.nn.Module):
    """A mixture of experts' load count per expert, per `how`: `torch.bincount` (as many
    bins as the largest index says), or the fixed-shape counts its refusal names."""

    def __init__(self, how: str):
        super().__init__()
        self.gate, self.how = torch.nn.Linear(6, 4), how

    def forward(self, x):
        scores = self.gate(x)
        chosen = scores.argmax(-1)
        if self.how == "bincount":
            load = torch.bincount(chosen, minlength=4)
        elif self.how == "one_hot":
            load = torch.nn.functional.one_hot(chosen, num_classes=4).sum(0)
        else:
            load = torch.zeros(4, dtype=torch.long).scatter_add_(0, chosen, torch.ones_like(chosen))
        return (scores.softmax(-1).mean(0) * load.float()).sum()


def test_bincount_is_refused_naming_fixed_shape_counts_which_train_like_eager():
    """Found by hunt61: told to move the count out of the model."""
    from exactness import side_by_side

    x = torch.randn(8, 6)
    with pytest.raises(remat_ir.ir.RematIRError, match=r"aten.bincount.*F.one_hot\(idx, num_classes=n\).sum\(0\)"):
        remat_ir.remat(_CountsLoad("bincount"), (x,), cost_model="flops")
    for how in ("one_hot", "scatter_add"):
        assert side_by_side(_CountsLoad(how), lambda m: remat_ir.remat(m, (x,), solver="recompute-all"), (x,), {},
                            lambda loss: loss, tolerance=1e-30) == {}
