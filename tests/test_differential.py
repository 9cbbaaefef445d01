"""Differential tests: random valid schedules of real lowered graphs train exactly like eager.

Hypothesis draws schedules (`exactness.random_schedule`: random dependency
orders, forward nodes left to the backward, recomputations in forward and
backward, frees as early as the simulator allows) of graphs lowered from real
models with dropout, BatchNorm and a custom autograd Function, and of random
small networks of random ops; the runtime trains each next to eager, and loss,
outputs, every gradient, buffers and the generator state after each step must
be bitwise equal (these models' ops are deterministic on CPU).
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from remat_ir.lowering import lower_torch
from remat_ir.runtimes.torch import ScheduledModule

import zoo_models
from exactness import SCHEDULE_DRAWS, SEARCH_MODELS as MODELS, lowered, random_schedule, side_by_side
from strategies import search

SETTINGS = search(12, derandomize=True)



@pytest.mark.parametrize("name", MODELS)
@SETTINGS
@given(**SCHEDULE_DRAWS)
def test_random_schedules_of_real_graphs_match_eager(name, seed, recompute, defer, groups):
    graph = lowered(name)
    schedule = random_schedule(graph, random.Random(seed), recompute_share=recompute,
                               defer_share=defer)
    model, args, kwargs, loss_of = zoo_models.ZOO[name]()
    errors = side_by_side(model, lambda m: ScheduledModule(m, graph, schedule, gradient_groups=groups),
                          args, kwargs, loss_of, steps=2)
    assert errors == {}, f"not bitwise equal to eager: {errors}"


_UNARY = ("relu", "tanh", "gelu", "dropout", "layer_norm", "softmax", "linear", "sigmoid_mul")
_BINARY = ("add", "mul", "matmul_t", "cat_linear")


class RandomNet(torch.nn.Module):
    """A random program over (batch, width) tensors: each step applies an op to earlier
    results; the loss sums the squares of the results nothing else read."""

    def __init__(self, program: list[tuple[str, tuple[int, ...]]], width: int):
        super().__init__()
        self.program = program
        self.linears = torch.nn.ModuleList(torch.nn.Linear(width, width)
                                           for op, _ in program if op == "linear")
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(width)
                                         for op, _ in program if op == "layer_norm")
        # cat_linear: Linear over two results side by side. Its backward hands each its
        # gradient as a slice of one tensor, which the lowering may copy out of it
        # (frontends/view_compaction.py) when one is read long after the other.
        self.cat_linears = torch.nn.ModuleList(torch.nn.Linear(2 * width, width)
                                               for op, _ in program if op == "cat_linear")

    def forward(self, x):
        values, linears, norms = [x], iter(self.linears), iter(self.norms)
        cat_linears = iter(self.cat_linears)
        for op, inputs in self.program:
            a = values[inputs[0]]
            b = values[inputs[-1]]
            if op == "relu":
                y = torch.relu(a)
            elif op == "tanh":
                y = torch.tanh(a)
            elif op == "gelu":
                y = torch.nn.functional.gelu(a)
            elif op == "dropout":
                y = torch.nn.functional.dropout(a, 0.3, training=True)
            elif op == "layer_norm":
                y = next(norms)(a)
            elif op == "softmax":
                y = torch.softmax(a, dim=-1)
            elif op == "linear":
                y = next(linears)(a)
            elif op == "sigmoid_mul":
                y = a * torch.sigmoid(a)
            elif op == "add":
                y = a + b
            elif op == "mul":
                y = a * b
            elif op == "cat_linear":
                y = next(cat_linears)(torch.cat([a, b], dim=-1))
            else:
                y = a @ b.t() @ b / a.shape[-1]
            values.append(y)
        read = {i for _, inputs in self.program for i in inputs}
        return sum((v * v).sum() for i, v in enumerate(values) if i not in read and i > 0)


@st.composite
def programs(draw):
    program = []
    for i in range(draw(st.integers(2, 9))):
        if draw(st.booleans()):
            program.append((draw(st.sampled_from(_UNARY)), (draw(st.integers(0, i)),)))
        else:
            program.append((draw(st.sampled_from(_BINARY)),
                            (draw(st.integers(0, i)), draw(st.integers(0, i)))))
    if all(op != "linear" for op, _ in program):  # something to train
        program.append(("linear", (len(program),)))
    return program


@search(15, derandomize=True)
@given(program=programs(), seed=st.integers(0, 2**32 - 1), groups=st.sampled_from([1, 2, 64]))
def test_random_networks_under_random_schedules_match_eager(program, seed, groups):
    width = 6
    torch.manual_seed(0)
    model = RandomNet(program, width)
    x = torch.randn(3, width, requires_grad=False)
    graph = lower_torch(model, (x,), cost_model="flops")
    schedule = random_schedule(graph, random.Random(seed), recompute_share=0.5, defer_share=0.5)
    torch.manual_seed(0)
    fresh = RandomNet(program, width)
    errors = side_by_side(fresh, lambda m: ScheduledModule(m, graph, schedule, gradient_groups=groups),
                          (x,), {}, lambda out: out, steps=2)
    assert errors == {}, f"not bitwise equal to eager: {errors}"
