"""`remat_ir.remat` and `remat_ir.remat_onnx`: lower, plan and wrap a model in one call.

This facade is the only place that wires the layers together (DESIGN.md):
a frontend (PyTorch, or ONNX through its imported module) lowers the model,
a solver plans it within the budget (`remat_ir.solvers.solve`), and the
PyTorch runtime returns a module that trains as usual.
"""

from __future__ import annotations

from remat_ir.ir import Graph, pb
from remat_ir.solvers import InfeasibleBudget, Progress, parse_budget, solve

__all__ = ["remat", "remat_onnx", "scheduled_onnx_module", "plan", "parse_budget", "InfeasibleBudget", "DEFAULT_SOLVER"]

#: What plans a budget when the caller names no solver: fast and budget-aware.
DEFAULT_SOLVER = "hiremate"


def plan(graph: Graph, budget=None, solver: str | None = None, *,
         time_limit_s: float | None = None, progress: Progress | None = None,
         **options) -> pb.Schedule:
    """The schedule to train with, stored in the graph: `solver`'s plan for `budget`
    (no budget: autograd's store-everything schedule)."""
    if solver is None:
        solver = "autograd" if budget is None else DEFAULT_SOLVER
    return solve(graph, budget, solver, time_limit_s=time_limit_s, progress=progress, **options)


def remat(model, example_inputs, budget=None, *, solver: str | None = None,
          example_kwargs: dict | None = None, cost_model: str = "profile",
          time_limit_s: float | None = None, progress: Progress | None = None, **options):
    """A module that trains like `model` within `budget` bytes of activation memory.

    `budget`: None (no limit), bytes, a size ("2GiB"), or a share of the
    store-everything peak ("50%"). `solver`: any name `remat-ir solvers` lists
    (default: hiremate when there is a budget). The returned module shares
    `model`'s parameters and buffers; its `.graph` and `.schedule` say what it runs.
    """
    from remat_ir.frontends.torch import lower
    from remat_ir.runtimes.torch import ScheduledModule

    graph = lower(model, example_inputs, example_kwargs=example_kwargs, cost_model=cost_model)
    schedule = plan(graph, budget, solver, time_limit_s=time_limit_s, progress=progress, **options)
    return ScheduledModule(model, graph, schedule)  # checks it in the simulator


def remat_onnx(model_or_path, example_inputs=None, budget=None, *, solver: str | None = None,
               trainable="initializers", cost_model: str = "profile",
               time_limit_s: float | None = None, progress: Progress | None = None, **options):
    """A trainable module running an ONNX model within `budget` bytes of activation memory.

    `model_or_path`: a path, bytes or `onnx.ModelProto`. `example_inputs` (a tuple in graph
    order, a dict by input name, or one tensor) fix dynamic dimensions such as batch and
    sequence length. The module's parameters are the model's float initializers that feed
    a differentiable op, by ONNX name (`trainable`: see `remat_ir.frontends.onnx.to_torch`);
    its forward takes the graph inputs positionally in graph order or by name and returns
    the graph outputs (the tensor when there is one, else a tuple). `budget` and `solver`
    are as for `remat`.
    """
    from remat_ir.frontends.onnx import lower_module, to_torch

    module, examples = to_torch(model_or_path, example_inputs, trainable=trainable)
    graph = lower_module(module, examples, cost_model=cost_model)
    schedule = plan(graph, budget, solver, time_limit_s=time_limit_s, progress=progress, **options)
    return scheduled_onnx_module(module, graph, schedule)


def scheduled_onnx_module(module, graph: Graph, schedule: pb.Schedule):
    """An imported ONNX module (`frontends.onnx.to_torch`) trained through `schedule` of its
    lowered `graph` (`frontends.onnx.lower_module`): what `remat_onnx` returns, for callers
    that lower once and plan themselves."""
    return _onnx_scheduled_class()(module, graph, schedule)


_ONNX_SCHEDULED = None


def _onnx_scheduled_class():
    """`ScheduledModule` taking the ONNX graph's inputs by position or name (made on first use,
    so that importing this module does not import torch)."""
    global _ONNX_SCHEDULED
    if _ONNX_SCHEDULED is None:
        from remat_ir.runtimes.torch import ScheduledModule

        class OnnxScheduledModule(ScheduledModule):
            """An ONNX model trained through a schedule; inputs in graph order or by name."""

            def forward(self, *args, **kwargs):
                return super().forward(*self._model.positional_inputs(args, kwargs))

        _ONNX_SCHEDULED = OnnxScheduledModule
    return _ONNX_SCHEDULED
