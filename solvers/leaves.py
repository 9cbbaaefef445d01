"""HiRemate's leaf solvers: options for the smallest clusters from any solver.

Every cluster gets options from its own H-ILP (`hilp.py`, over its children).
The clusters at the bottom of the tree (no child clusters, at most `M_l`
forward nodes) may also be planned by other solvers, as the HiRemate paper
pools the options of several leaf solvers: each one named in hiremate's
`leaf_solvers` option (`checkmate`, `rotor`, a plugin or an `exec:` program:
anything `remat_ir.solvers.solve` can run) plans the cluster, cut out as a
graph of its own with the rest of the network as a context between its
forward and backward (`subgraph.py`), under a grid of peak budgets that
bound what it saves for its backward, as the H-ILP's grid does; each
schedule it returns, measured inside the full graph, is one more option. A
solver that refuses a budget is asked once more at the smallest budget it
names.

Checkmate brings what the H-ILP's options cannot express inside a cluster:
single results recomputed several times, and plans bounded by their peak
rather than by the bytes they keep. It is not the default: on the graphs of
`benchmarks/hiremate.py` its plans cost options time within the 60 s, and
more options make the top level's H-ILP slower to solve, so that the plans
came out no faster (GPT-2 at 50%: 7.2% predicted overhead against 5.6%).
"""

from __future__ import annotations

from collections.abc import Sequence

from remat_ir.ir import RematIRError, store_all

from .base import BadRequest, Deadline, InfeasibleBudget, quiet
from .options import PartOption, PartShape
from .registry import find
from .subgraph import compute_sequences, part_graph

#: Each leaf solver plans a cluster under the peak of its store-everything schedule
#: less part of the bytes that schedule saves: these shares of them kept.
SAVED_SHARES = (0.75, 0.5, 0.25, 0.1, 0.0)


def leaf_solver_names(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """The `leaf_solvers` option as names: a comma-separated string or a sequence;
    each must name a solver (UnknownSolver lists the known ones), not hiremate itself,
    that loads: a plugin that fails to import or an `exec:` program that cannot start
    (`external.check_runnable`) is refused here, before planning, rather than failing on
    every cluster."""
    if value is None or value == "":
        return ()
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise BadRequest(f"leaf_solvers must be solver names, e.g. 'checkmate,rotor'; got {value!r}")
    names = [n.strip() for n in names if n.strip()]
    for name in names:
        if name == "hiremate":
            raise BadRequest("leaf_solvers cannot name hiremate itself: its clusters already "
                             "have hiremate's own H-ILP options; name other solvers, e.g. checkmate")
        info = find(name)
        try:
            info.load()
        except RematIRError as error:
            error.args = (f"leaf_solvers {name!r}: {error}", *error.args[1:])
            raise
    return tuple(dict.fromkeys(names))


def leaf_options(shape: PartShape, names: Sequence[str], seconds: float, deadline: Deadline,
                 name: str, progress=quiet, failed: set[str] | None = None) -> list[PartOption]:
    """Options of the cluster `shape` from each solver in `names` at every budget of
    `SAVED_SHARES` (`seconds` each, none past `deadline`). A solver that fails (an
    error, not a refused budget) is named in `progress` and skipped: the cluster keeps
    its other options. `failed`, shared by the clusters of one plan, holds the solvers
    that failed: each is said once and not asked again (a broken program fails on every
    cluster, and said once per cluster, its error filled the progress)."""
    failed = set() if failed is None else failed
    names = [solver for solver in names if solver not in failed]
    if not names:
        return []
    from . import solve  # the package imports this module's users lazily

    tg = shape.tg
    nodes = shape.forward + shape.backward
    # Larger than anything the part holds at once, even recomputing all of it.
    context = 2 * sum(tg.memory[n] for n in nodes) + max(tg.workspace[n] for n in nodes) + 1
    graph = part_graph(tg.graph, shape.forward, shape.backward, name, context_bytes=context)
    peak = store_all(graph).predicted_peak_bytes
    saved = shape.measure(shape.forward, shape.backward).saved
    options: list[PartOption] = []
    for solver in names:
        tried: set[int] = set()
        budgets = [peak - int((1 - share) * saved) for share in SAVED_SHARES]
        while budgets and not deadline.expired():
            budget = budgets.pop(0)
            if budget in tried:
                continue
            tried.add(budget)
            try:
                schedule = solve(graph, budget, solver, time_limit_s=seconds)
            except InfeasibleBudget as refused:
                if refused.smallest_feasible is not None and refused.smallest_feasible > budget:
                    budgets = [refused.smallest_feasible]   # lower budgets fail too
                else:
                    budgets = []
                continue
            except RematIRError as error:
                failed.add(solver)
                progress(f"hiremate: leaf solver {solver!r} failed on {name} and is not "
                         f"asked again (the clusters plan with their other options): {error}")
                break
            sequences = compute_sequences(schedule, shape.forward, shape.backward)
            if sequences is not None:
                options.append(shape.measure(*sequences))
    return options
