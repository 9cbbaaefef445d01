"""`remat_ir.remat`: lower, plan and wrap a model in one call.

This facade is the only place that wires the layers together (DESIGN.md):
the PyTorch frontend lowers the model, a schedule is chosen for the budget,
and the PyTorch runtime returns a module that trains as usual.
"""

from __future__ import annotations

import re

from remat_ir.ir import Graph, RematIRError, pb, recompute_all, store_all

#: Schedules available before the solver layer: built from the graph alone.
BUILTIN_SCHEDULES = {"store_all": store_all, "recompute_all": recompute_all}

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


class InfeasibleBudget(RematIRError):
    """No schedule fits the budget; `smallest_feasible` is the lowest peak known to work."""

    def __init__(self, budget: int, smallest_feasible: int, detail: str = ""):
        self.budget, self.smallest_feasible = budget, smallest_feasible
        super().__init__(f"no schedule fits a budget of {budget} bytes; the smallest feasible "
                         f"budget found is {smallest_feasible} bytes{detail}")


def parse_budget(budget, store_all_peak: int) -> int | None:
    """Bytes from `budget`: None, a number of bytes, "2GiB"/"500 MB", or "50%" of the
    store-everything peak. ValueError with the accepted forms otherwise."""
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, (int, float, str)):
        raise ValueError(f"budget must be bytes, a size like '2GiB', or a percentage like '50%'; "
                         f"got {budget!r}")
    if isinstance(budget, (int, float)):
        if budget <= 0:
            raise ValueError(f"budget must be positive, got {budget}")
        return int(budget)
    text = budget.strip()
    if text.endswith("%"):
        try:
            percent = float(text[:-1])
        except ValueError:
            raise ValueError(f"budget {budget!r} is not a percentage like '50%'") from None
        if percent <= 0:
            raise ValueError(f"budget must be positive, got {budget!r}")
        return int(store_all_peak * percent / 100)
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([KMGT]i?B|B)?", text, flags=re.IGNORECASE)
    if not match:
        raise ValueError(f"budget {budget!r} is not a size; use bytes (1000000), a size "
                         "('500MB', '2GiB') or a percentage of the store-everything peak ('50%')")
    number, unit = float(match.group(1)), (match.group(2) or "").upper()
    if number <= 0:
        raise ValueError(f"budget must be positive, got {budget!r}")
    return int(number * _UNITS[unit])


def plan(graph: Graph, budget=None, solver: str | None = None) -> pb.Schedule:
    """The schedule to train with: `solver`'s, or the fastest built-in one within `budget`.

    The chosen schedule is stored in the graph. Raises InfeasibleBudget naming the
    smallest peak any candidate reached when none fits.
    """
    if solver is not None and solver not in BUILTIN_SCHEDULES:
        raise ValueError(f"unknown solver {solver!r}; available: {', '.join(BUILTIN_SCHEDULES)}")
    reference = store_all(graph)
    limit = parse_budget(budget, reference.predicted_peak_bytes)
    names = [solver] if solver else list(BUILTIN_SCHEDULES)
    candidates = [reference if name == "store_all" else BUILTIN_SCHEDULES[name](graph) for name in names]
    fitting = [s for s in candidates if limit is None or s.predicted_peak_bytes <= limit]
    if not fitting:
        raise InfeasibleBudget(limit, min(s.predicted_peak_bytes for s in candidates),
                               f" (by {', '.join(names)})")
    best = min(fitting, key=lambda s: s.predicted_time_s)
    if limit is not None:
        best.budget_bytes = limit
    return graph.add_schedule(best)


def remat(model, example_inputs, budget=None, *, solver: str | None = None,
          example_kwargs: dict | None = None, cost_model: str = "profile"):
    """A module that trains like `model` within `budget` bytes of activation memory.

    `budget`: None (no limit), bytes, a size ("2GiB"), or a share of the
    store-everything peak ("50%"). The returned module shares `model`'s
    parameters and buffers; its `.graph` and `.schedule` say what it runs.
    """
    from remat_ir.frontends.torch import lower
    from remat_ir.runtimes.torch import ScheduledModule

    graph = lower(model, example_inputs, example_kwargs=example_kwargs, cost_model=cost_model)
    return ScheduledModule(model, graph, plan(graph, budget, solver))  # checks it in the simulator
