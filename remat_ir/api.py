"""`remat_ir.remat`: lower, plan and wrap a model in one call.

This facade is the only place that wires the layers together (DESIGN.md):
the PyTorch frontend lowers the model, a solver plans it within the budget
(`remat_ir.solvers.solve`), and the PyTorch runtime returns a module that
trains as usual.
"""

from __future__ import annotations

from remat_ir.ir import Graph, pb
from remat_ir.solvers import InfeasibleBudget, Progress, parse_budget, solve

__all__ = ["remat", "plan", "parse_budget", "InfeasibleBudget", "DEFAULT_SOLVER"]

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
