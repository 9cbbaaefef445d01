"""User inputs are bound by the positions the IR states (`GraphInput.user_input_position`),
not by their names: a graph built by hand runs, and files of format 1.0 (no positions)
still load and run, with gradients bitwise equal to eager's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

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
