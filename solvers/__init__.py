"""Solvers: choose what to keep and what to recompute under a memory budget.

    from remat_ir import ir, solvers
    graph = ir.load("gpt2.rir")
    schedule = solvers.solve(graph, "50%", solver="rotor", time_limit_s=60)

`solve` finds the solver (built-in, entry-point plugin or `exec:COMMAND`),
runs it, replays its schedule in the simulator (a schedule that breaks a rule
or the budget is refused, never used), records the budget, solver, options,
predictions and planning time in it, and stores it in the graph.
Solvers read and write the IR only; none of them imports torch (DESIGN.md).
"""

from __future__ import annotations

import inspect
import time

from remat_ir.ir import Graph, pb, simulate, store_all

from .base import BadRequest, Deadline, InfeasibleBudget, Progress, SolverError, parse_budget, quiet
from .registry import ENTRY_POINT_GROUP, EXEC_PREFIX, SolverInfo, UnknownSolver, available, find

__all__ = ["solve", "available", "find", "parse_budget", "InfeasibleBudget", "SolverError", "BadRequest",
           "UnknownSolver", "SolverInfo", "Progress", "Deadline", "ENTRY_POINT_GROUP", "EXEC_PREFIX"]


def _check_options(name: str, function, options: dict) -> None:
    """Unknown options are a user error named here, not a TypeError from inside the solver."""
    parameters = inspect.signature(function).parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return
    accepted = [p for p, spec in parameters.items()
                if spec.kind is spec.KEYWORD_ONLY and p not in ("time_limit_s", "progress")]
    for option in options:
        if option not in accepted:
            raise BadRequest(f"solver {name!r} has no option {option!r}; its options: "
                             f"{', '.join(accepted) or 'none'}")


def solve(graph: Graph, budget=None, solver: str = "rotor", *, time_limit_s: float | None = None,
          progress: Progress | None = None, **options) -> pb.Schedule:
    """Plan `graph` within `budget` with `solver`; return the schedule stored in the graph.

    `budget`: None (no limit), bytes, a size ("2GiB") or a share of the
    store-everything peak ("50%"). Raises InfeasibleBudget (with the smallest
    feasible budget the solver knows), UnknownSolver, or SolverError when the
    solver fails or returns a schedule the simulator refuses.
    """
    info = find(solver)
    function = info.load()
    _check_options(solver, function, options)
    percentage = isinstance(budget, str) and budget.strip().endswith("%")
    limit = parse_budget(budget, store_all(graph).predicted_peak_bytes if percentage else 0)
    progress = progress or quiet
    started = time.monotonic()
    schedule = function(graph, limit, time_limit_s=time_limit_s, progress=progress, **options)
    elapsed = time.monotonic() - started
    if not isinstance(schedule, pb.Schedule):
        raise SolverError(f"solver {solver!r} returned {type(schedule).__name__}, not a Schedule")
    result = simulate(graph, schedule, budget=limit)
    if not result.valid:
        raise SolverError(f"solver {solver!r} ({info.origin}) returned a schedule the simulator "
                          f"refuses: {result.violation}")
    schedule.solver = solver
    schedule.name = schedule.name or solver
    if limit is not None:
        schedule.budget_bytes = limit
    schedule.predicted_peak_bytes = result.peak_bytes
    schedule.predicted_time_s = result.total_time_s
    schedule.solve_time_s = elapsed
    if time_limit_s is not None:
        schedule.solver_params["time_limit_s"] = str(time_limit_s)
    for key, value in options.items():
        schedule.solver_params[key] = str(value)
    return graph.add_schedule(schedule)
