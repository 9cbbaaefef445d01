"""User inputs are bound by the positions the IR states (`GraphInput.user_input_position`),
not by their names: a graph built by hand runs, and files of format 1.0 (no positions)
still load and run, with gradients bitwise equal to eager's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import remat_ir
from remat_ir import ir
from remat_ir.ir import pb
from remat_ir.runtimes.torch import RuntimeInputError, ScheduledModule

MLP_FILE = Path(__file__).resolve().parent.parent / "examples" / "mlp.rir"
LAYERS, WIDTH, BATCH, DROPOUT = 4, 128, 256, 0.1


class HandMLP(torch.nn.Module):
    """The model `ir.examples.mlp` writes out op by op: Linear layers, ReLU and dropout
    between them, MSE loss; its forward is the eager reference."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))

    def forward(self, x, target):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < LAYERS - 1:
                x = torch.native_dropout(torch.relu(x), DROPOUT, True)[0]
        return F.mse_loss(x, target)


def _step(module: torch.nn.Module, *inputs) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Loss and parameter gradients of one step from a fixed RNG state."""
    module.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    loss = module(*inputs)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in module.parameters()]


def _assert_bitwise_equal(graph: ir.Graph, *inputs, order=(0, 1)) -> None:
    """Every schedule of `graph` trains HandMLP as eager does; `order` says where x and
    target go in the call."""
    torch.manual_seed(0)
    model = HandMLP()
    x, target = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
    eager_loss, eager_grads = _step(model, x, target)
    call = [None, None]
    call[order[0]], call[order[1]] = x, target
    for schedule in graph.proto.schedules:
        loss, grads = _step(ScheduledModule(model, graph, schedule), *call)
        assert torch.equal(loss, eager_loss), schedule.name
        assert all(torch.equal(a, b) for a, b in zip(grads, eager_grads, strict=True)), schedule.name


def _as_version_1_0(graph: ir.Graph, names: dict[str, str] | None = None) -> bytes:
    """The graph as a format 1.0 file: no positions or argument names, user inputs
    renamed by `names` (old name -> name in the file)."""
    old = pb.Graph()
    old.CopyFrom(graph.proto)
    old.version.major, old.version.minor = 1, 0
    for entry in old.inputs:
        entry.ClearField("user_input_position")
        entry.ClearField("argument_name")
        entry.name = (names or {}).get(entry.name, entry.name)
    return ir.dumps(old)


def test_shipped_example_states_its_input_positions():
    graph = ir.load(MLP_FILE)
    assert (graph.proto.version.major, graph.proto.version.minor) == ir.FORMAT_VERSION
    assert [(e.name, e.user_input_position) for e in graph.user_inputs()] == [("x", 0), ("target", 1)]


def test_shipped_example_runs_with_eager_gradients():
    """examples/mlp.rir names its inputs "x" and "target", which the runtime once had to
    parse as "input<N>" (a ValueError)."""
    _assert_bitwise_equal(ir.load(MLP_FILE))


def test_version_1_0_file_takes_positions_from_input_order(tmp_path):
    path = tmp_path / "old.rir"
    path.write_bytes(_as_version_1_0(ir.load(MLP_FILE)))
    graph = ir.load(path)
    assert (graph.proto.version.major, graph.proto.version.minor) == ir.FORMAT_VERSION
    assert [(e.name, e.user_input_position) for e in graph.user_inputs()] == [("x", 0), ("target", 1)]
    _assert_bitwise_equal(graph)


def test_version_1_0_file_takes_positions_from_the_old_input_names(tmp_path):
    """The PyTorch frontend of format 1.0 named user inputs "input<N>", N the flat
    argument position, which need not follow input order: here x is passed second."""
    old = _as_version_1_0(ir.load(MLP_FILE), {"x": "input1", "target": "input0"})
    graph = ir.loads(old)
    assert [(e.name, e.user_input_position) for e in graph.user_inputs()] == [("input0", 0), ("input1", 1)]
    _assert_bitwise_equal(graph, order=(1, 0))


def test_wrong_input_is_named_by_its_argument():
    graph = ir.load(MLP_FILE)
    graph.proto.inputs[1].argument_name = "target"
    module = ScheduledModule(HandMLP(), graph, graph.proto.schedules[0])
    with pytest.raises(RuntimeInputError, match=r"target is \[256, 64\] torch.float32, but the "
                                                r"graph was lowered for \[256, 128\]"):
        module(torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH // 2))


class _ReadsAnArgument(torch.nn.Module):
    """Adds an argument after a BatchNorm (which updates its running mean in place) and
    multiplies by another: passed the model's own buffer or weight, eager reads them."""

    def __init__(self):
        super().__init__()
        self.l1, self.bn, self.l2 = torch.nn.Linear(6, 6), torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 6)

    def forward(self, x, stat, weight):
        return ((self.l2(self.bn(self.l1(x)) + stat) @ weight).square().mean())


@pytest.mark.parametrize("passed", ["buffer", "parameter"])
def test_an_argument_that_is_the_models_own_tensor_is_planned_for_after_another_was(passed, capsys):
    """Lowered with other tensors there, a later call passing the model's BatchNorm
    buffer or a parameter as an argument ran the kept plan, which reads the two apart:
    the buffer as before the forward's update (loss 0.41989 where eager gives 0.42018),
    the parameter's gradient summed in another order (found by a review). Such a call is
    planned again, and trains bitwise like eager; without a planner it is refused; a
    view of a member is refused by name, at the call and at lowering."""
    import copy

    import remat_ir

    torch.manual_seed(0)
    model, x = _ReadsAnArgument(), torch.randn(8, 6)
    eager = copy.deepcopy(model)
    other = torch.randn(6, 6, requires_grad=passed == "parameter")   # as a parameter would
    scheduled = remat_ir.remat(model, (x, torch.randn(6), other), cost_model="flops")
    alone = ScheduledModule(model, scheduled.graph, scheduled.schedule)

    def arguments(m):
        return (m.bn.running_mean, torch.randn(6, 6)) if passed == "buffer" else (torch.randn(6), m.l2.weight)

    for _ in range(2):
        losses = []
        for m in (eager, scheduled):
            torch.manual_seed(1)
            m.zero_grad()
            losses.append(m(x, *arguments(eager if m is eager else model)))
            losses[-1].backward()
        assert torch.equal(*losses)
        for (name, a), b in zip(eager.named_parameters(), model.parameters()):
            assert torch.equal(a.grad, b.grad), name
        for a, b in zip(eager.buffers(), model.buffers()):
            assert torch.equal(a, b)
    member = "bn.running_mean" if passed == "buffer" else "l2.weight"
    assert f"argument args[{1 if passed == 'buffer' else 2}] is the model's {member}" in capsys.readouterr().err
    torch.manual_seed(1)
    with pytest.raises(RuntimeInputError, match=rf"is the model's {member}, which it was not at lowering"):
        alone(x, *arguments(model))
    viewed = ((model.bn.running_mean[:], torch.randn(6, 6)) if passed == "buffer"
              else (torch.randn(6), model.l2.weight[:]))
    with pytest.raises(RuntimeInputError, match=rf"argument args\[\d\] is a view of the model's {member}"):
        scheduled(x, *viewed)
    from remat_ir.frontends.torch import LoweringError

    with pytest.raises(LoweringError, match=rf"_ReadsAnArgument: argument args\[\d\] is a view of the "
                                            rf"model's {member}"):
        remat_ir.remat(model, (x, *viewed), cost_model="flops")
    # A view of a detached alias (`.detach()`, `.data`) shares the member's memory too:
    # AOTAutograd failed on it with "list index out of range" (found by a review).
    aliased = ((model.bn.running_mean.detach()[:], torch.randn(6, 6)) if passed == "buffer"
               else (torch.randn(6), model.l2.weight.data[:]))
    with pytest.raises(LoweringError, match=rf"_ReadsAnArgument: argument args\[\d\] is a view of the "
                                            rf"model's {member}"):
        remat_ir.remat(model, (x, *aliased), cost_model="flops")


class _Tempered(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)

    def forward(self, x, temperature):
        return (self.a(x) / temperature).square().mean()


def test_a_plain_argument_changing_at_every_step_is_refused_after_a_few_plans(capsys):
    """A float passed anew at every step (a temperature schedule) is traced into the
    graph: each value was lowered and planned again, without end (found by a review).
    Up to `VALUE_REPLANS` values of one argument besides the first are planned for,
    bitwise like eager;
    then the call is refused, saying to pass a tensor, which one plan serves; values seen
    before and calls whose tensors differ too (one plan per shape) go on."""
    import copy

    import remat_ir
    from remat_ir.runtimes.torch import VALUE_REPLANS

    torch.manual_seed(0)
    model, x = _Tempered(), torch.randn(3, 4)
    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, (x, 1.0), cost_model="flops")
    values = [1.0 + 0.25 * i for i in range(VALUE_REPLANS + 1)] + [1.0, torch.randn(5, 4)]
    for value in values:
        inputs = (value, 2.0) if isinstance(value, torch.Tensor) else (x, value)
        for m in (eager, scheduled):
            m.zero_grad()
            m(*inputs).backward()
        assert torch.equal(eager.a.weight.grad, model.a.weight.grad)
    with pytest.raises(RuntimeInputError, match=rf"argument args\[1\] is 9.0, lowered for .*taken "
                                                rf"{VALUE_REPLANS} other values since lowering.*as a tensor"):
        scheduled(x, 9.0)
    scheduled(x, torch.tensor(9.0)).backward()   # a tensor: planned once, for every value
    scheduled(x, torch.tensor(7.0)).backward()
    # The other floats, the other shape, the tensor temperature.
    assert capsys.readouterr().err.count("lowering and planning again") == VALUE_REPLANS + 2


def test_a_graph_edited_in_memory_is_validated_before_it_runs():
    """A graph built or edited in memory (not read from a file, which `ir.load`
    validates): a node whose argument names a value it does not list among its inputs
    ran into a raw `UnboundLocalError` in the generated code (found by a review)."""
    import remat_ir
    from remat_ir.ir.errors import InvalidGraph

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    x = torch.randn(3, 4)
    scheduled = remat_ir.remat(model, (x,), cost_model="flops")
    proto = pb.Graph()
    proto.CopyFrom(scheduled.graph.proto)
    tanh = next(n for n in proto.nodes if n.op == "aten.tanh.default")
    del tanh.inputs[:]
    graph = ir.Graph(proto)
    with pytest.raises(InvalidGraph, match=r"node 'tanh' \(aten.tanh.default, id \d+\): the values its "
                                           r"arguments refer to \[\d+\] are not its inputs \[\]"):
        ScheduledModule(model, graph, ir.store_all(graph))


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_remat_called_where_gradients_are_off_plans_for_training(context):
    """`remat` inside `torch.no_grad()` was refused as if the forward detached everything,
    and inside `torch.inference_mode()` with export's "True != False" (found by a review);
    the plan is for training calls, so the model is lowered with gradients on (the example
    inputs, inference tensors there, copied)."""
    from exactness import side_by_side

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def make(m):
        with context():
            return remat_ir.remat(m, (torch.randn(3, 4),), cost_model="flops", solver="recompute-all")

    assert side_by_side(model, make, (torch.randn(3, 4),), {}, lambda y: y.square().sum()) == {}


class _TakesOneBatch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, batch):
        return self.lin(batch["x"] if isinstance(batch, dict) else batch[0]).sum()


@pytest.mark.parametrize("given", ["dict", "list"])
def test_a_forward_taking_one_dict_or_list_given_it_spread_is_told_to_wrap_it(given):
    """Found by a review: a dict is read as keyword arguments and a list as positional ones,
    and torch.export's refusal was said as data-dependent control flow. Wrapped in a tuple,
    it trains."""
    x = torch.randn(2, 4)
    batch = {"x": x} if given == "dict" else [x, x]
    with pytest.raises(remat_ir.ir.RematIRError, match=r"_TakesOneBatch's forward does not take the example "
                                                       r"inputs as (keyword|positional) arguments.* inside a tuple"):
        remat_ir.remat(_TakesOneBatch(), batch, solver="recompute-all", cost_model="flops")
    remat_ir.remat(_TakesOneBatch(), (batch,), solver="recompute-all", cost_model="flops")(batch).backward()


class _MultiTask(torch.nn.Module):
    """A shared body and a head per task, chosen by the task's name (GLUE-style)."""

    def __init__(self, tasks: int):
        super().__init__()
        self.body = torch.nn.Linear(4, 4)
        self.heads = torch.nn.ModuleDict({f"task{i}": torch.nn.Linear(4, 1 + i % 3) for i in range(tasks)})

    def forward(self, x, task: str):
        return self.heads[task](torch.tanh(self.body(x))).square().mean()


def test_a_string_naming_the_path_takes_a_plan_per_value_up_to_the_plans_kept():
    """Found by a review: a multi-task model given the task's name was refused at the
    sixth task, told to pass the string as a tensor. Each name is a plan, up to
    `max_plans`; beyond, the refusal says to keep more plans or to remat each path."""
    import copy

    import remat_ir

    torch.manual_seed(0)
    model, x = _MultiTask(7), torch.randn(3, 4)
    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, (x, "task0"), cost_model="flops", max_plans=6)
    for i in list(range(6)) + [2, 0]:
        for m in (eager, scheduled):
            m.zero_grad()
            m(x, f"task{i}").backward()
        for (name, p), q in zip(eager.named_parameters(), model.parameters()):
            assert (p.grad is None and q.grad is None) or torch.equal(p.grad, q.grad), (i, name)
    with pytest.raises(RuntimeInputError, match=r"argument args\[1\] is 'task6'.*each value is a plan of its "
                                                r"own, and at most max_plans=6 are kept"):
        scheduled(x, "task6")
