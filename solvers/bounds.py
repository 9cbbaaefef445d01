"""A proven lower bound on the step time any rematerialization schedule reaches within a budget.

Why: a solver's "predicted overhead" says how good a plan is only next to what is
possible. Checkmate proves optima on graphs of tens of nodes; on thousands of nodes
nothing did, so an overhead target (12% at 30% of the peak, say) could not be told
apart from an impossible one. This bound answers that, and a budget it cannot meet is
proven infeasible for every schedule (without offloading).

The program looks at *moments*: the first runs of chosen backward nodes m_0, m_1, ...,
each a descendant of the one before, so that every schedule meets them in this order.
Per moment j, over 0/1 variables:

- `live[j, s]`: storage `s` holds a live value while m_j runs; those bytes, m_j's new
  outputs and its workspace fit the budget (and are at most the variable `peak`);
- `runs[j, n]`: node `n`, which allocates, runs between m_j and m_j+1 (after the last
  moment: to the end);
- a node that must run after m_j (a descendant) finds each storage it reads live at m_j
  or allocated since, before the first later moment it is known to precede; a node
  running between m_j and m_j+1 finds its inputs likewise; a storage live at m_j+1 was
  live at m_j or allocated since; m_j's inputs and the graph outputs already computed
  are live;
- a node that ran before m_0 (an ancestor) pays its time for every interval it runs in:
  each is a recomputation (`paid[n]`); another node pays for all but one.

The objective is the time of every node once, the step overhead, the recomputations and
the footprint price times `peak`. Every real schedule gives a point of the program (its
state at each moment; `tests/test_bounds.py` checks it on random schedules), so the
program's optimum is at most any schedule's time. Counting per storage rather than per
allocation, and views (which allocate nothing) as free, only lower the bound.

The linear relaxation is weak: a fraction of a stored tensor supports a fraction of a
recomputation in every interval. So the 0/1 program is searched for a time limit and the
dual bound HiGHS proves is returned; it only rises with more time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import mip
import numpy as np

from remat_ir.ir import Graph, pb, simulate, store_all
from remat_ir.ir.memory import NodeMemory, activation_storages, counted, new_storages

from . import milp
from .base import BadRequest, Progress, SolverError, quiet
from .budgets import parse_budget

#: How many backward nodes the bound looks at, by default.
DEFAULT_MOMENTS = 24


@dataclass(frozen=True)
class LowerBound:
    """No schedule of the graph within `budget_bytes` is faster than `time_s` (predicted,
    by the graph's cost model), or none fits at all (`feasible` False)."""
    budget_bytes: int
    feasible: bool
    time_s: float
    #: The store-everything schedule's predicted time, for overhead figures.
    store_all_time_s: float
    moments: int
    seconds: float

    @property
    def overhead(self) -> float:
        """Least possible overhead over store-everything (predicted time / its - 1)."""
        return self.time_s / self.store_all_time_s - 1 if self.feasible else float("inf")


class _Columns:
    """Columns of the linear program with their bounds, costs and what each stands for
    (`("live", j, storage)`, `("runs", j, node)`, `("paid", node)`, `("peak",)`)."""

    def __init__(self):
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.cost: list[float] = []
        self.keys: list[tuple] = []

    def add(self, key: tuple, lower=0.0, upper=1.0, cost=0.0) -> int:
        self.lower.append(lower)
        self.upper.append(upper)
        self.cost.append(cost)
        self.keys.append(key)
        return len(self.cost) - 1


class _Rows:
    """Sparse rows `lower <= sum(coefficient * column) <= upper`."""

    def __init__(self):
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.entries: list[dict[int, float]] = []

    def add(self, terms: dict[int, float], lower: float, upper: float) -> None:
        self.entries.append(terms)
        self.lower.append(lower)
        self.upper.append(upper)


def _edges(graph: Graph) -> tuple[dict, dict]:
    """Per node, the producers of its inputs and the readers of its outputs, as sets."""
    nodes = NodeMemory(graph, graph.phase_order(pb.FORWARD) + graph.phase_order(pb.BACKWARD))
    return ({n: set(nodes.node_inputs(n)) for n in nodes.order},
            {n: set(users) for n, users in nodes.node_users.items()})


def _closure(start: int, edges: dict[int, set[int]]) -> set[int]:
    seen, stack = set(), [start]
    while stack:
        for m in edges[stack.pop()]:
            if m not in seen:
                seen.add(m)
                stack.append(m)
    return seen


def _weight(graph: Graph, n: int) -> int:
    """Bytes a node's operands, outputs and workspace take while it runs."""
    node = graph.node(n)
    storages = activation_storages(graph, list(node.inputs) + list(node.outputs))
    return sum(graph.storage_bytes(s) for s in storages) + node.cost.workspace_bytes


def choose_moments(graph: Graph, count: int = DEFAULT_MOMENTS) -> list[int]:
    """Backward nodes to look at, each a descendant of the one before (so they run in
    this order in every schedule): in each of `count` stretches of the backward order,
    the descendant of the previous moment whose operands, outputs and workspace take the
    most bytes (where memory is tightest when it runs)."""
    backward = graph.phase_order(pb.BACKWARD)
    _, readers = _edges(graph)
    count = max(1, min(count, len(backward)))
    chosen: list[int] = []
    allowed = set(backward)
    for k in range(count):
        stretch = [n for n in backward[k * len(backward) // count:(k + 1) * len(backward) // count]
                   if n in allowed]
        if stretch:
            chosen.append(max(stretch, key=lambda n: _weight(graph, n)))
            allowed = _closure(chosen[-1], readers)
    return chosen


def relaxation(graph: Graph, budget_bytes: int, moments: list[int]):
    """The program of the module docstring, its 0/1 columns not yet marked integral:
    (columns, rows, seconds of every node once plus the step overhead, the
    store-everything simulation). It reasons per storage: a value is
    available while its storage is live, or once a node allocating that storage ran
    again (views and in-place results allocate nothing, so they need no variable)."""
    order = graph.phase_order(pb.FORWARD) + graph.phase_order(pb.BACKWARD)
    inputs, readers = _edges(graph)
    after = [_closure(m, readers) for m in moments]       # descendants: run after the moment
    before = [_closure(m, inputs) for m in moments]       # ancestors: ran before it
    for j in range(1, len(moments)):
        if moments[j] not in after[j - 1]:
            raise BadRequest(f"lower bound: moment {moments[j]} does not depend on {moments[j - 1]}")
    base = simulate(graph, store_all(graph))
    cost_model = graph.proto.provenance.cost_model
    once_s = base.forward_time_s + base.backward_time_s + base.overhead_time_s
    allocators: dict[int, list[int]] = {}                 # storage -> nodes allocating it
    for n in order:
        for s in new_storages(graph, graph.node(n)):
            allocators.setdefault(s, []).append(n)

    def storages(n: int) -> set[int]:
        """Activation storages `n` reads that nodes of the graph allocate."""
        return {s for s in activation_storages(graph, graph.node(n).inputs) if s in allocators}

    columns, rows = _Columns(), _Rows()
    peak = columns.add(("peak",), upper=np.inf, cost=cost_model.peak_byte_s)
    runs: list[dict[int, int]] = []       # per moment j: node -> "allocates between moment j and j+1"
    live: list[dict[int, int]] = []       # per moment j: storage -> "live while moment j runs"
    for j, m in enumerate(moments):
        runs.append({n: columns.add(("runs", j, n)) for n in order
                     if n not in after[j] and n != m and new_storages(graph, graph.node(n))})
        live.append({})

    def alive(j: int, s: int) -> int:
        if s not in live[j]:
            live[j][s] = columns.add(("live", j, s))
        return live[j][s]

    def remade(s: int, intervals: range) -> dict[int, float] | None:
        """Terms "an allocator of `s` ran in one of `intervals`", or None where one of
        them runs in the first of them anyway (nothing to require)."""
        terms = {}
        for p in allocators[s]:
            if p not in runs[intervals[0]]:
                return None
            for i in intervals:
                terms[runs[i][p]] = 1.0
        return terms

    last = len(moments) - 1
    for j, m in enumerate(moments):
        for s in storages(m):
            columns.lower[alive(j, s)] = 1.0
        for v in graph.output_value_ids:                  # the caller holds outputs to the end
            if counted(graph, v) and graph.producer(v) in before[j]:
                columns.lower[alive(j, graph.value(v).storage_id)] = 1.0
        # A node run after moment j finds each storage it reads live at j or allocated
        # since; one known to run before moment `until` finds it allocated before then.
        for z in after[j] - (after[j + 1] if j < last else set()):
            until = next((i for i in range(j + 1, len(moments)) if z in before[i]), last + 1)
            for s in storages(z):
                if (terms := remade(s, range(j, until))) is not None:
                    rows.add({alive(j, s): 1.0, **terms}, 1.0, np.inf)
        # A node allocating between moments j and j+1 reads storages live at j or allocated since.
        for n, column in runs[j].items():
            for s in storages(n):
                if (terms := remade(s, range(j, j + 1))) is not None:
                    rows.add({alive(j, s): 1.0, **terms, column: -1.0}, 0.0, np.inf)
    # A storage live at moment j+1 was live at j or allocated since.
    for j in range(last - 1, -1, -1):
        for s, column in list(live[j + 1].items()):
            if (terms := remade(s, range(j, j + 1))) is not None:
                rows.add({column: 1.0, alive(j, s): -1.0, **{c: -1.0 for c in terms}}, -np.inf, 0.0)
    # Memory while each moment runs: its live storages, new outputs and workspace.
    for j, m in enumerate(moments):
        made_by_m = set(new_storages(graph, graph.node(m)))
        fixed = sum(graph.storage_bytes(s) for s in made_by_m) + graph.node(m).cost.workspace_bytes
        memory = {c: float(graph.storage_bytes(s)) for s, c in live[j].items() if s not in made_by_m}
        rows.add(memory, -np.inf, float(budget_bytes - fixed))
        rows.add({**memory, peak: -1.0}, -np.inf, float(-fixed))
    # Each allocation between moments beyond a node's first run is a recomputation.
    for n in order:
        intervals = [runs[j][n] for j in range(len(moments)) if n in runs[j]]
        if not intervals:
            continue
        first = 0.0 if n in before[0] else 1.0
        node = graph.node(n)
        if node.non_recomputable or node.mutating:
            rows.add({c: 1.0 for c in intervals}, -np.inf, first)
            continue
        paid = columns.add(("paid", n), upper=np.inf, cost=node.cost.time_s)
        rows.add({paid: 1.0, **{c: -1.0 for c in intervals}}, -first, np.inf)

    return columns, rows, once_s, base


def lower_bound(graph: Graph, budget_bytes, *, moments: list[int] | int = DEFAULT_MOMENTS,
                time_limit_s: float = 60.0, integral: bool = True,
                progress: Progress = quiet) -> LowerBound:
    """The least step time any rematerialization schedule (no offloading) can have within
    `budget_bytes` of activation memory (any form `solve` accepts: bytes, "2GiB", "30%",
    a share), proven by the relaxation in the module docstring. `moments`: how many, or which backward nodes (each a descendant of the one before).
    `integral`: search the 0/1 program for `time_limit_s` and return the bound it proved
    (much tighter: the linear relaxation lets a fraction of a stored tensor support a
    fraction of a recomputation in every interval), else solve the linear relaxation."""
    started = time.perf_counter()
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
        # 0 bytes is a budget too here (a graph whose activations are all resident)
        budget_bytes = parse_budget(budget_bytes, simulate(graph, store_all(graph)).peak_bytes)
    if budget_bytes is None:
        raise BadRequest("lower bound: give a budget (bytes, '2GiB', '30%' or a share like 0.3)")
    if isinstance(moments, bool) or not isinstance(moments, (int, list, tuple)) or (
            isinstance(moments, int) and moments < 1):
        raise BadRequest(f"lower bound: moments must be a positive count or a list of backward "
                         f"node ids, not {moments!r}")
    if isinstance(moments, int):
        moments = choose_moments(graph, moments)
    backward = set(graph.phase_order(pb.BACKWARD))
    if strays := [m for m in moments if m not in backward]:
        raise BadRequest(f"lower bound: moments must be backward nodes of {graph.name!r}; "
                         f"{strays[:5]} are not")
    columns, rows, once_s, base = relaxation(graph, budget_bytes, list(moments))
    feasible, extra = _solve(columns, rows, time_limit_s, integral, progress)
    return LowerBound(budget_bytes=int(budget_bytes), feasible=feasible, time_s=once_s + extra,
                      store_all_time_s=base.total_time_s, moments=len(moments),
                      seconds=time.perf_counter() - started)


def _solve(columns: _Columns, rows: _Rows, time_limit_s: float, integral: bool,
           progress: Progress) -> tuple[bool, float]:
    """(feasible, least objective proven) of the program, by the MILP backend the solvers
    share (`milp.py`; highspy driven directly leaves mip's HiGHS unable to run afterwards)."""
    model = milp.new_model("lower-bound")
    binary = ("live", "runs")
    variables = [model.add_var(lb=lo, ub=hi, obj=c, var_type=mip.BINARY if integral and key[0] in binary
                               else mip.CONTINUOUS)
                 for lo, hi, c, key in zip(columns.lower, columns.upper, columns.cost, columns.keys)]
    for terms, lo, hi in zip(rows.entries, rows.lower, rows.upper):
        expression = mip.LinExpr([variables[c] for c in terms], list(terms.values()))
        if lo > -np.inf:
            model.add_constr(expression >= lo)
        if hi < np.inf:
            model.add_constr(expression <= hi)
    outcome = milp.optimize(model, time_limit_s, progress, "lower bound", relax=not integral)
    if outcome.status == "infeasible":
        return False, float("inf")
    bound = model.objective_bound if integral else outcome.objective
    if bound is None or not np.isfinite(bound):
        raise SolverError(f"the lower bound's program proved nothing in {outcome.seconds:.0f} s "
                          f"(status {outcome.status!r}); give it more time")
    return True, max(0.0, float(bound))
