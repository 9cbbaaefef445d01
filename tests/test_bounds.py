"""The lower bound (`solvers.bounds`) is proven: every real schedule is a point of its
program, so no schedule within the budget is faster than the bound, and a budget it
refuses fits no schedule.

The point of a schedule is read here from its steps, independently of how the program
is built: which storages are live while each moment's node first runs, which allocating
nodes run between two moments, how often each node runs again.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remat_ir import ir, solvers
from remat_ir.ir import pb, simulate, store_all
from remat_ir.ir.memory import counted, new_storages
from remat_ir.solvers import bounds
from remat_ir.solvers.base import BadRequest

from builders import chain
from exactness import lowered, random_schedule
from strategies import search, training_graphs


def _point(graph: ir.Graph, schedule: pb.Schedule, moments: list[int], keys: list[tuple]) -> list[float]:
    """The schedule as values of the program's columns."""
    index = {m: j for j, m in enumerate(moments)}
    live: set[int] = set()
    live_at: dict[int, set[int]] = {}
    ran_between: set[tuple[int, int]] = set()
    runs: Counter = Counter()
    interval = None
    for step in schedule.steps:
        if step.WhichOneof("action") == "free":
            live.discard(step.free)
            continue
        n = step.compute
        node = graph.node(n)
        if n in index and index[n] not in live_at:
            interval = index[n]
            live_at[interval] = {graph.value(v).storage_id for v in live | set(node.inputs)
                                 if counted(graph, v)}
        elif interval is not None and new_storages(graph, node):
            ran_between.add((interval, n))
        runs[n] += 1
        live.update(node.outputs)
    peak = simulate(graph, schedule).peak_bytes
    values = []
    for key in keys:
        if key[0] == "live":
            values.append(float(key[2] in live_at[key[1]]))
        elif key[0] == "runs":
            values.append(float((key[1], key[2]) in ran_between))
        elif key[0] == "paid":
            values.append(float(max(0, runs[key[1]] - 1)))
        else:
            values.append(float(peak))
    return values


def _broken_rows(columns, rows, x: list[float]) -> list[str]:
    broken = [f"column {columns.keys[c]} = {x[c]} outside [{columns.lower[c]}, {columns.upper[c]}]"
              for c in range(len(x)) if not columns.lower[c] - 1e-9 <= x[c] <= columns.upper[c] + 1e-9]
    for terms, lower, upper in zip(rows.entries, rows.lower, rows.upper):
        total = sum(x[c] * w for c, w in terms.items())
        if not lower - 1e-6 * max(1.0, abs(lower)) <= total <= upper + 1e-6 * max(1.0, abs(upper)):
            broken.append(f"{lower} <= {total} <= {upper}: "
                          + ", ".join(f"{w:+g} {columns.keys[c]}={x[c]:g}" for c, w in terms.items()))
    return broken


def _assert_schedule_is_a_point(graph: ir.Graph, schedule: pb.Schedule, moments: list[int]) -> float:
    """Check every row at the schedule's point; return the program's objective there."""
    result = simulate(graph, schedule)
    assert result.valid, result.violation
    columns, rows, once_s, _ = bounds.relaxation(graph, result.peak_bytes, moments)
    x = _point(graph, schedule, moments, columns.keys)
    broken = _broken_rows(columns, rows, x)
    assert not broken, f"{len(broken)} rows broken by a valid schedule, e.g. {broken[:3]}"
    objective = once_s + sum(c * v for c, v in zip(columns.cost, x))
    assert objective <= result.total_time_s * (1 + 1e-9) + 1e-12
    return objective


@search(60)
@given(graph=training_graphs(), seed=st.integers(0, 2**32 - 1), count=st.integers(1, 5),
       recompute=st.sampled_from([0.0, 0.3, 0.8]), defer=st.sampled_from([0.0, 0.5, 1.0]))
def test_no_random_schedule_beats_the_bound(graph, seed, count, recompute, defer):
    schedule = random_schedule(graph, random.Random(seed), recompute_share=recompute, defer_share=defer)
    moments = bounds.choose_moments(graph, count)
    _assert_schedule_is_a_point(graph, schedule, moments)
    result = simulate(graph, schedule)
    bound = bounds.lower_bound(graph, result.peak_bytes, moments=moments, time_limit_s=30)
    assert bound.feasible
    assert bound.time_s <= result.total_time_s * (1 + 1e-6)


@pytest.mark.parametrize("share", [0.8, 0.6, 0.5])
def test_checkmates_proven_optimum_is_not_below_the_bound(share):
    graph, _ = chain(12)
    try:
        optimum = simulate(graph, solvers.solve(graph, f"{share:.0%}", "checkmate", time_limit_s=60))
    except solvers.InfeasibleBudget:
        return
    peak = simulate(graph, store_all(graph)).peak_bytes
    bound = bounds.lower_bound(graph, int(peak * share), moments=6)
    assert bound.feasible
    assert bound.time_s <= optimum.total_time_s * (1 + 1e-6)


def test_real_plans_of_a_lowered_model_are_points():
    """Views, in-place results, dropout masks and several outputs per node, as torch lowers
    them: hiremate's plans and random schedules satisfy every row."""
    graph = lowered("gpt2")
    peak = simulate(graph, store_all(graph)).peak_bytes
    moments = bounds.choose_moments(graph, 8)
    for share in (0.9, 0.6):
        plan = solvers.solve(graph, int(peak * share), "hiremate", time_limit_s=20)
        _assert_schedule_is_a_point(graph, plan, moments)
    for seed in range(3):
        schedule = random_schedule(graph, random.Random(seed), recompute_share=0.5, defer_share=0.5)
        _assert_schedule_is_a_point(graph, schedule, moments)


def test_a_budget_below_what_the_loss_step_holds_is_proven_infeasible():
    """At the first backward node everything it reads is live: a budget below that is refused
    for every schedule, as checkmate finds."""
    graph, _ = chain(8)
    first = graph.phase_order(pb.BACKWARD)[0]
    node = graph.node(first)
    held = sum(graph.storage_bytes(s) for s in {graph.value(v).storage_id for v in node.inputs
                                                if counted(graph, v)})
    bound = bounds.lower_bound(graph, held - 1, moments=[first])
    assert not bound.feasible and bound.overhead == float("inf")
    with pytest.raises(solvers.InfeasibleBudget):
        solvers.solve(graph, held - 1, "checkmate", time_limit_s=30)


def test_bad_moments_and_budgets_get_one_clear_error():
    graph, _ = chain(6)
    backward = graph.phase_order(pb.BACKWARD)
    with pytest.raises(BadRequest, match="does not depend on"):
        bounds.lower_bound(graph, 10**9, moments=[backward[-1], backward[0]])
    with pytest.raises(BadRequest, match="must be backward nodes"):
        bounds.lower_bound(graph, 10**9, moments=[graph.phase_order(pb.FORWARD)[0]])
    for moments in (0, "abc", True):
        with pytest.raises(BadRequest, match="moments must be a positive count"):
            bounds.lower_bound(graph, 10**9, moments=moments)
    for budget in ("lots", -5, None):
        with pytest.raises(BadRequest, match="budget"):
            bounds.lower_bound(graph, budget)
    assert bounds.lower_bound(graph, "60%").budget_bytes == bounds.lower_bound(graph, 0.6).budget_bytes
