"""Solvers: choose what to keep and what to recompute under a memory budget.

    from remat_ir import ir, solvers
    graph = ir.load("gpt2.rir")
    schedule = solvers.solve(graph, "50%", solver="rotor", time_limit_s=60)

`solve` finds the solver (built-in, entry-point plugin or `exec:COMMAND`),
runs it, replays its schedule in the simulator (a schedule that breaks a rule
or the budget is refused, never used), records the budget, solver, options,
predictions and planning time in it, and stores it in the graph.
Solvers read and write the IR only; none of them imports torch (docs/architecture.md).
"""

from __future__ import annotations

import inspect
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from remat_ir.ir import Graph, RematIRError, pb, simulate, store_all
from remat_ir.ir.fingerprint import structure_fingerprint, wiring_fingerprint
from remat_ir.ir.gradient_sums import moved_sum_problem

from .base import BadRequest, Deadline, InfeasibleBudget, Progress, SolverError, quiet
from .budgets import describe, floor_problem, is_share, parse_budget, parse_host_budget, refusal
from .offload import add_offloads, plan_with_offload
from .registry import (ENTRY_POINT_GROUP, EXEC_PREFIX, OFFLOADING_SOLVERS, SolverInfo, UnknownSolver,
                       available, find)

__all__ = ["solve", "available", "find", "parse_budget", "is_share", "describe", "InfeasibleBudget",
           "SolverError", "BadRequest", "UnknownSolver", "SolverInfo", "Progress", "Deadline",
           "ENTRY_POINT_GROUP", "EXEC_PREFIX", "remember_floor", "known_floor", "DEFAULT_SOLVER",
           "add_offloads", "check_request"]

#: The solver `solve()` uses when none is named, and the one `remat()` and the `remat-ir`
#: command plan a budget with: fast and budget-aware. Defined here once so they all agree.
DEFAULT_SOLVER = "hiremate"

#: (structure fingerprint, solver) -> the lowest-peak schedule a refusal named, so that
#: the smallest feasible budget named is feasible when asked for, also with another
#: lowering of the same model (whose profiled times, which steer the solver, differ).
_FLOORS: OrderedDict[tuple[str, str], pb.Schedule] = OrderedDict()
_FLOORS_KEPT = 64


def _check_options(name: str, function, options: dict) -> None:
    """Unknown options are a user error named here, not a TypeError from inside the solver."""
    parameters = inspect.signature(function).parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return
    accepted = [p for p, spec in parameters.items()
                if spec.kind is spec.KEYWORD_ONLY and p not in ("time_limit_s", "progress")]
    for option, value in options.items():
        if option not in accepted:
            raise BadRequest(f"solver {name!r} has no option {option!r}; its options: "
                             f"{', '.join(accepted) or 'none'}")
        kind = _KINDS.get(str(parameters[option].annotation))
        if kind is not None and (isinstance(value, bool) != (kind is bool)
                                 or not isinstance(value, kind)):
            raise BadRequest(f"option {option!r} of solver {name!r} must be "
                             f"{_KIND_NAMES[kind]}, not {value!r}")


#: Options whose annotation names one of these types get values of that type only: the
#: string "no" given for `anneal` was true to Python, so hiremate annealed.
_KINDS = {"bool": bool, "int": int, "float": (int, float)}
_KIND_NAMES = {bool: "true or false", int: "an integer", (int, float): "a number"}


def check_request(solver, time_limit_s, options: dict, *,
                  offload: bool = False) -> tuple[SolverInfo, Callable]:
    """The solver `solver` names and its function, after checking the request's types and
    options: what `solve` checks first, and what `remat()` checks before tracing the model."""
    if not isinstance(solver, str):
        raise BadRequest(f"solver must be a name (`remat-ir solvers` lists them), not {solver!r}")
    _check_time_limit(time_limit_s)
    if offload and solver in OFFLOADING_SOLVERS:
        # Offloading moves values of a plan that moves none: one with its own moves was
        # refused from inside the ladder, minutes in, and only where the plan had moves.
        raise BadRequest(f"solver {solver!r} plans offloads itself; offload=True (--offload) adds "
                         f"offloads to a rematerialization solver's plan: ask for solver={solver!r} "
                         f"without offload, or for offload with another solver (hiremate by default)")
    info = find(solver)
    function = info.load()
    _check_options(solver, function, options)
    return info, function


def _check_time_limit(time_limit_s) -> None:
    """None or a positive number of seconds: a negative, zero or NaN limit planned anyway
    (hiremate called its plan optimal) or killed an external solver at once."""
    if time_limit_s is None:
        return
    if (isinstance(time_limit_s, bool) or not isinstance(time_limit_s, (int, float))
            or not time_limit_s > 0 or time_limit_s == float("inf")):
        raise BadRequest(f"time_limit_s must be a positive number of seconds (or None for the "
                         f"solver's default), not {time_limit_s!r}")


def solve(graph: Graph, budget=None, solver: str = DEFAULT_SOLVER, *, time_limit_s: float | None = None,
          progress: Progress | None = None, offload: bool = False, host_budget=None,
          reuse: Sequence[tuple[Graph, pb.Schedule]] = (), **options) -> pb.Schedule:
    """Plan `graph` within `budget` with `solver`; return the schedule stored in the graph.

    `budget`: None (no limit), bytes, a size ("2GiB") or a share of the
    store-everything peak ("50%"). With `offload`, the solver's plans at a ladder
    of budgets (refined around its fastest rung) are offloaded down to `budget` over the graph's host link and the
    fastest is kept (`offload.plan_with_offload`), within `host_budget` (bytes or a
    size) of host memory; `time_limit_s` then bounds the whole ladder, each plan
    getting a share of it. Raises InfeasibleBudget (with the smallest feasible budget
    the solver knows), UnknownSolver, or SolverError when the solver fails or
    returns a schedule the simulator refuses. A plugin solver is handed a copy of `graph`
    (what it edits is not planned nor trained), and an error of its own is a SolverError
    naming it.

    `reuse`: (graph, schedule) pairs planned before (by `remat`'s planner, for the same
    model at other input shapes). The first made by `solver` for a graph wired like this
    one, for a budget no smaller a share of its peak, that the simulator finds valid on
    this graph within the budget is the plan (`reusable`), and the solver is not run; its
    `solver_params["reused_from"]` names the inputs it was planned for. Not with
    `offload`, whose transfers are timed for one graph.
    """
    if not isinstance(graph, Graph):
        raise BadRequest(f"graph must be a remat_ir.ir.Graph (ir.load(path) reads a file, "
                         f"ir.Graph(proto) wraps a message), not {type(graph).__module__}.{type(graph).__qualname__}")
    info, function = check_request(solver, time_limit_s, options, offload=offload)
    peak = store_all(graph).predicted_peak_bytes
    limit = parse_budget(budget, peak)
    host_limit = parse_host_budget(host_budget, peak)
    progress = progress or quiet
    started = time.monotonic()
    reused = None if offload else reusable(graph, solver, limit, peak, reuse)
    function = _guarded(info, function)
    given = _given_graph(graph, info)
    try:
        if reused is not None:
            schedule = reused[0]
        elif offload and limit is not None:
            schedule = plan_with_offload(
                graph, limit, lambda b, time_limit_s=None: function(given, b, time_limit_s=time_limit_s,
                                                                    progress=progress, **options),
                host_budget=host_limit, time_limit_s=time_limit_s, progress=progress)
        else:
            schedule = function(given, limit, time_limit_s=time_limit_s, progress=progress, **options)
    except InfeasibleBudget as refused:
        schedule = _floor_within(graph, solver, limit, refused, offload, host_limit)
        if schedule is None:
            raise refusal(graph, refused, peak, solver) from None
        progress(f"{solver}: refused {describe(limit, peak)}; using the smallest-feasible plan "
                 f"named for this graph before ({describe(schedule.predicted_peak_bytes, peak)})")
    elapsed = time.monotonic() - started
    if not isinstance(schedule, pb.Schedule):
        raise SolverError(f"solver {solver!r} returned {type(schedule).__name__}, not a Schedule")
    if host_limit is not None:
        schedule.host_budget_bytes = host_limit
    result = simulate(graph, schedule, budget=limit)
    if not result.valid:
        raise SolverError(f"solver {solver!r} ({info.origin}) returned a schedule the simulator "
                          f"refuses: {result.violation}")
    if (moved := moved_sum_problem(graph, schedule)) is not None:
        raise SolverError(f"solver {solver!r} ({info.origin}) returned a schedule no runtime can "
                          f"run: {moved}")
    if result.transferred_bytes and graph.proto.provenance.host_link.bandwidth_bytes_per_s <= 0:
        # Its transfers would be timed at nothing, its predicted time that of a plan
        # without them (found by a review: an external solver's offloads were so).
        raise SolverError(f"solver {solver!r} ({info.origin}) returned a schedule that offloads "
                          f"to host memory, and this graph describes no host link to time its "
                          f"transfers: give one (remat(..., host_bandwidth='25GB/s'), the CLI's "
                          f"--host-bandwidth 25GB/s), or plan without offloading")
    schedule.solver = solver
    schedule.name = schedule.name or solver
    schedule.predicted_host_peak_bytes = result.host_peak_bytes
    if limit is not None:
        schedule.budget_bytes = limit
    if offload:
        schedule.solver_params["offload"] = "true"
    schedule.predicted_peak_bytes = result.peak_bytes
    schedule.predicted_time_s = result.total_time_s
    schedule.solve_time_s = elapsed
    if time_limit_s is not None:
        schedule.solver_params["time_limit_s"] = str(time_limit_s)
    for key, value in options.items():
        schedule.solver_params[key] = str(value)
    return graph.add_schedule(schedule)


def _trusted(info: SolverInfo) -> bool:
    """Built-in solvers are this package's code and leave the graph as they found it; an
    external program (`exec:`) only reads the file it is given."""
    return info.origin in ("built-in", "exec")


def _given_graph(graph: Graph, info: SolverInfo) -> Graph:
    """The graph a solver is handed: `graph` itself for a trusted one, else a copy.

    Why: a plugin got the caller's live graph, and what it edited there was trained
    (found by a review: a plugin that dropped a parameter's gradient output left its
    `.grad` None without a word; one that changed a `pow` exponent trained another
    model; one that reordered the node list hung code generation). Its schedule is
    still replayed on the caller's graph, so an edit can only make it refused."""
    if _trusted(info):
        return graph
    proto = pb.Graph()
    proto.CopyFrom(graph.proto)
    return Graph(proto)


def _guarded(info: SolverInfo, function: Callable) -> Callable:
    """`function`, with an error a plugin raises that is not one of ours (InfeasibleBudget,
    SolverError...) turned into a SolverError naming the plugin, as `_load_plugin` does
    for a plugin that fails to load: a KeyError from inside it read as our bug."""
    if _trusted(info):
        return function

    def guarded(graph, *args, **kwargs):
        try:
            return function(graph, *args, **kwargs)
        except InfeasibleBudget as refused:   # its floor is checked as an `exec:` solver's
            problem = floor_problem(refused.budget, refused.smallest_feasible, graph)
            if problem is not None:
                raise SolverError(f"plugin solver {info.name!r} ({info.origin}) refused a budget of "
                                  f"{refused.budget:,} bytes {problem}") from None
            if refused.smallest_feasible is not None:   # a NumPy integer, as a number of bytes
                refused.smallest_feasible = int(refused.smallest_feasible)
            raise
        except RematIRError:
            raise
        except Exception as error:
            raise SolverError(f"plugin solver {info.name!r} failed: {type(error).__name__}: "
                              f"{error} (raised inside {info.origin}: report it to its "
                              f"authors, or plan with another solver)") from error
    return guarded


#: How much larger a share of its store-everything peak a budget may leave a new shape
#: than the reused plan's budget left its own (`reusable`).
REUSE_SLACK = 0.05


def reusable(graph: Graph, solver: str, limit: int | None, peak: int,
             known: Sequence[tuple[Graph, pb.Schedule]]) -> tuple[pb.Schedule, Graph] | None:
    """(a copy of the first schedule in `known`, the graph it was made for): made by
    `solver` for a graph wired like
    `graph` (`wiring_fingerprint`) at a share of its store-everything peak no smaller than
    `limit` is of `peak` (within `REUSE_SLACK`), that the simulator finds valid on `graph`
    within `limit`; those of the graphs whose store-everything peak is nearest to `peak`
    first. None where store-everything fits (what the solvers return then) or none does.

    Why: a model trained with dynamic padding is lowered again for each new sequence
    length, and planning took most of that (a 4-layer Llama on CPU: trace 1 s, profile
    1.5 s, hiremate 5 s; a 12-layer GPT-2 13 s of hiremate). Memory scales with the
    shapes alike for every node, so the plan of one length keeps its share of the peak
    at another: measured on that Llama at 60% and 40%, planned for 4 x 128 and reused
    at 4 x 64, 4 x 96, 4 x 256 and 2 x 512, every reused plan fitted, its predicted step
    time from 0.2% under to 3.5% over the plan made for that shape, priced on the same
    graph (`benchmarks/new_shapes.py`)."""
    if limit is None or peak <= limit or not known:
        return None
    wiring = wiring_fingerprint(graph)
    alike = []
    for source, planned in known:
        if planned.solver != solver or wiring_fingerprint(source) != wiring:
            continue
        top = max(1, store_all(source).predicted_peak_bytes)
        # A plan made for a smaller share of its peak than this budget allows here would
        # recompute more than needed (a byte budget, a smaller shape): planned itself.
        if limit / peak <= (1 + REUSE_SLACK) * planned.budget_bytes / top:
            alike.append((abs(math.log(top / max(1, peak))), source, planned))
    for _, source, planned in sorted(alike, key=lambda a: a[0]):
        schedule = pb.Schedule()
        schedule.CopyFrom(planned)
        schedule.ClearField("budget_bytes")
        if simulate(graph, schedule, budget=limit).valid:
            schedule.solver_params["reused_from"] = ", ".join(
                f"{i.argument_name or i.name} {list(source.value(i.value_id).shape)}"
                for i in source.proto.inputs if source.value(i.value_id).kind == pb.USER_INPUT)
            return schedule, source
    return None


def _fits_request(graph: Graph, known: pb.Schedule | None, offload: bool,
                  host_limit: int | None) -> pb.Schedule | None:
    """`known` (a remembered floor), or None where it moves values to the host and the
    request did not ask for offloading, or its copies exceed the request's host budget.
    Found by CI: a floor an earlier offloaded plan left was taken for a request under a
    host budget, and the solve failed as a solver returning a plan the simulator refuses."""
    if known is None or not any(s.HasField("offload") or s.HasField("prefetch") for s in known.steps):
        return known
    if not offload:
        return None
    if host_limit is not None:
        bounded = pb.Schedule()
        bounded.CopyFrom(known)
        bounded.host_budget_bytes = host_limit
        if not simulate(graph, bounded).valid:
            return None
    return known


def _floor_key(graph: Graph, solver: str) -> tuple[str, str]:
    """Graphs alike but for their metadata share floors: transformers' classifiers set
    `config.problem_type` in their first forward, so a model lowered again after one call
    records another attribute, and was refused at the floor named for it before."""
    return structure_fingerprint(graph, metadata=False), solver


def remember_floor(graph: Graph, solver: str, schedule: pb.Schedule) -> None:
    """Keep `schedule` as the lowest-peak plan known for graphs structured like `graph`."""
    key = _floor_key(graph, solver)
    known = _FLOORS.get(key)
    if known is None or schedule.predicted_peak_bytes < known.predicted_peak_bytes:
        kept = pb.Schedule()
        kept.CopyFrom(schedule)
        _FLOORS[key] = kept
    _FLOORS.move_to_end(key)
    while len(_FLOORS) > _FLOORS_KEPT:
        _FLOORS.popitem(last=False)


def known_floor(graph: Graph, solver: str) -> pb.Schedule | None:
    """The lowest-peak plan remembered for graphs structured like `graph`, re-simulated on
    `graph` (its times; its peak is the same by the fingerprint's definition)."""
    known = _FLOORS.get(_floor_key(graph, solver))
    if known is None:
        return None
    schedule = pb.Schedule()
    schedule.CopyFrom(known)
    schedule.ClearField("budget_bytes")
    result = simulate(graph, schedule)
    if not result.valid:
        return None
    schedule.predicted_peak_bytes, schedule.predicted_time_s = result.peak_bytes, result.total_time_s
    return schedule


def _floor_within(graph: Graph, solver: str, limit: int, refused: InfeasibleBudget, offload: bool,
                  host_limit: int | None) -> pb.Schedule | None:
    """After `solver` refused `limit`: the remembered floor if it fits `limit` (and the
    request: `_fits_request`); else None, after remembering the refusal's own floor and
    naming the lower of the two in it."""
    known = _fits_request(graph, known_floor(graph, solver), offload, host_limit)
    if known is not None and known.predicted_peak_bytes <= limit:
        return known
    if refused.schedule is not None and simulate(graph, refused.schedule).valid:
        remember_floor(graph, solver, refused.schedule)
        known = _fits_request(graph, known_floor(graph, solver), offload, host_limit)
    if known is not None and (refused.smallest_feasible is None
                              or known.predicted_peak_bytes < refused.smallest_feasible):
        refused.smallest_feasible, refused.schedule = known.predicted_peak_bytes, known
    return None
