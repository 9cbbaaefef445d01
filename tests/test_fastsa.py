"""`fastsa`: its kernel's peak is the simulator's, its moves keep the state exact,
its schedules are valid, within budget, deterministic, and near Checkmate's optimum."""

from __future__ import annotations

import random

import numpy as np
import pytest
from builders import chain
from hypothesis import assume, given
from hypothesis import strategies as st
from strategies import search, training_graphs

from remat_ir import ir, solvers
from remat_ir.solvers import anneal, fastsa
from remat_ir.solvers.structure import TrainingGraph

SETTINGS = search(60)


def _random_sequence(tg: TrainingGraph, rng: random.Random, extra: int) -> list[int]:
    """The store-everything order with `extra` recomputations of recomputable forward
    nodes inserted at random places where what they read has been computed; some
    first runs moved later (a forward node computed only where it is needed)."""
    sequence = list(tg.order)
    movable = sorted(tg.recomputable - {n for n in tg.forward if tg.graph.node(n).random})
    for _ in range(extra):
        if not movable:
            break
        n = rng.choice(movable)
        first_input = max((sequence.index(p) for p in tg.node_inputs(n)), default=-1)
        sequence.insert(rng.randint(first_input + 1, len(sequence)), n)
    return sequence


def _reads_one_storage_from_two_nodes(graph) -> bool:
    for node in graph.nodes.values():
        producers: dict[int, set] = {}
        for v in node.inputs:
            producers.setdefault(graph.value(v).storage_id, set()).add(graph.producer(v))
        if any(len(p) > 1 for p in producers.values()):
            return True
    return False


def _kernel(tg: TrainingGraph, sequence: list[int]):
    problem = fastsa.build(tg, [[n] for n in tg.order])
    size, placement = fastsa._placement(problem, fastsa._units_of(problem, sequence))
    return problem, anneal.new_state(problem.arrays, size, placement)


def _loads(tree: np.ndarray, pending: np.ndarray) -> np.ndarray:
    """Bytes live at each slot: a leaf plus the additions pending on its ancestors."""
    size = len(tree) // 2
    loads = tree[size:].copy()
    for leaf in range(size):
        p = (size + leaf) >> 1
        while p >= 1:
            loads[leaf] += pending[p]
            p >>= 1
    return loads


def _simulated(tg: TrainingGraph, sequence: list[int]):
    schedule = fastsa._schedule(tg, sequence)
    return schedule.predicted_peak_bytes, schedule.predicted_time_s


@SETTINGS
@given(graph=training_graphs(), seed=st.integers(0, 2**16), extra=st.integers(0, 12))
def test_kernel_peak_and_time_are_the_simulators(graph, seed, extra):
    """Exact except where one node reads two values of one storage made by two nodes (an
    in-place chain read twice), where the kernel may count less (a known gap, left to
    the simulator's check in `fastsa._checked`): such graphs are left out here."""
    assume(not _reads_one_storage_from_two_nodes(graph))
    tg = TrainingGraph(graph)
    sequence = _random_sequence(tg, random.Random(seed), extra)
    _, state = _kernel(tg, sequence)
    peak, seconds = _simulated(tg, sequence)
    assert int(state[4][1]) == peak
    assert float(state[6][0]) == pytest.approx(seconds, rel=1e-12)


@SETTINGS
@given(graph=training_graphs(), seed=st.integers(0, 2**16), weight=st.sampled_from([1.0, 8.0]))
def test_state_after_annealing_moves_equals_a_fresh_build(graph, seed, weight):
    """Thousands of moves, accepted and undone, leave the incremental state (every
    lifetime, the whole segment tree) as a build from the resulting sequence would."""
    tg = TrainingGraph(graph)
    problem, state = _kernel(tg, list(tg.order))
    if len(problem.candidates) == 0:
        return
    peak = int(state[4][1])
    anneal.seed(seed)
    anneal.anneal(problem.arrays, state, problem.candidates, 3000, 0, 3000, 1e-3, 1e-9,
                  max(1, peak // 2), weight, False)
    units = anneal.sequence(state)
    fresh = anneal.new_state(problem.arrays, state[3].shape[0],
                             [(int(u), int(s)) for s in np.flatnonzero(state[3] >= 0)
                              for u in [state[3][s]]])
    occ, cnt, uend, slot, tree, pending, seconds = state
    np.testing.assert_array_equal(cnt, fresh[1])
    for array, mine, theirs, owner in ((occ, occ, fresh[0], np.arange(len(cnt))),
                                       (uend, uend, fresh[2], problem.arrays[12])):
        used = np.arange(array.shape[1])[None, :] < cnt[owner][:, None]   # entries in use
        np.testing.assert_array_equal(mine[used], theirs[:, :array.shape[1]][used])
    np.testing.assert_array_equal(slot, fresh[3])
    np.testing.assert_array_equal(_loads(tree, pending), _loads(fresh[4], fresh[5]))
    assert tree[1] == fresh[4][1]
    assert seconds[0] == pytest.approx(fresh[6][0], rel=1e-9)
    if not _reads_one_storage_from_two_nodes(graph):    # the known gap (see above)
        assert int(state[4][1]) == _simulated(tg, problem.expand(units))[0]


@SETTINGS
@given(graph=training_graphs(), share=st.sampled_from([0.9, 0.6, 0.4]))
def test_schedules_are_valid_and_within_budget_or_refused_with_a_feasible_floor(graph, share):
    peak = ir.store_all(graph).predicted_peak_bytes
    budget = max(1, int(peak * share))
    try:
        schedule = solvers.solve(graph, budget, "fastsa", iterations=4000)
    except solvers.InfeasibleBudget as refused:
        floor = solvers.solve(graph, refused.smallest_feasible, "fastsa", iterations=4000)
        assert floor.predicted_peak_bytes <= refused.smallest_feasible
        return
    result = ir.simulate(graph, schedule, budget=budget)
    assert result.valid, result.violation
    assert result.peak_bytes <= budget


def test_same_seed_same_schedule():
    graph, _ = chain(16)
    first = solvers.solve(graph, "50%", "fastsa", iterations=20_000, seed=3)
    again = solvers.solve(graph, "50%", "fastsa", iterations=20_000, seed=3)
    assert [s.compute for s in first.steps] == [s.compute for s in again.steps]


@pytest.mark.parametrize("share", [0.8, 0.6, 0.5])
def test_within_three_percent_of_checkmates_optimum_on_a_chain(share):
    graph, _ = chain(14)
    optimum = solvers.solve(graph, f"{share:.0%}", "checkmate", time_limit_s=60)
    assert optimum.status == ir.pb.OPTIMAL
    annealed = solvers.solve(graph, f"{share:.0%}", "fastsa", iterations=200_000)
    assert annealed.predicted_time_s <= 1.03 * optimum.predicted_time_s


def test_polishing_a_start_plan_never_makes_it_slower(gpt2_graph):
    start = solvers.solve(gpt2_graph, "60%", "rotor")
    polished = solvers.solve(gpt2_graph, "60%", "fastsa", start="rotor", iterations=50_000)
    assert polished.predicted_peak_bytes <= start.budget_bytes
    assert polished.predicted_time_s <= start.predicted_time_s


def test_fastsa_plans_hiremates_smallest_clusters(gpt2_graph):
    """As a leaf solver, annealing plans clusters (with their context nodes) for hiremate."""
    said: list[str] = []
    schedule = solvers.solve(gpt2_graph, "60%", "hiremate", leaf_solvers="fastsa",
                             repartition=True, time_limit_s=60, progress=said.append)
    assert not [m for m in said if "leaf solver 'fastsa' failed" in m]
    result = ir.simulate(gpt2_graph, schedule, budget=schedule.budget_bytes)
    assert result.valid and result.peak_bytes <= schedule.budget_bytes


@SETTINGS
@given(graph=training_graphs(), share=st.sampled_from([0.9, 0.6, 0.4]))
def test_polishing_never_leaves_the_budget_and_never_slows_the_fastest_fitting_start(graph, share):
    from remat_ir.solvers.base import Deadline
    from remat_ir.solvers.baselines import recompute_everything, sqrt_schedule

    tg = TrainingGraph(graph)
    budget = max(1, int(ir.store_all(graph).predicted_peak_bytes * share))
    starts = [ir.store_all(graph), recompute_everything(tg), sqrt_schedule(tg)]
    polished = fastsa.polish(tg, starts, budget, deadline=Deadline(None), iterations=3000)
    fitting = [s for s in starts if s.predicted_peak_bytes <= budget]
    if polished is None:
        assert not fitting
        return
    result = ir.simulate(graph, polished, budget=budget)
    assert result.valid, result.violation
    if fitting:
        assert result.total_time_s <= min(s.predicted_time_s for s in fitting) + 1e-12


@pytest.mark.parametrize("option, said", [
    (dict(weight="abc"), "option 'weight' of solver 'fastsa' must be a number, not 'abc'"),
    (dict(weight=0.5), "fastsa: "), (dict(iterations=-1), "fastsa: "),
    (dict(seed=1.5), "option 'seed' of solver 'fastsa' must be an integer, not 1.5")])
def test_bad_options_get_one_clear_error(option, said):
    graph, _ = chain(6)
    with pytest.raises(solvers.BadRequest, match=said):
        solvers.solve(graph, "50%", "fastsa", **option)


def _two_value_draws() -> ir.Graph:
    """Two random nodes whose draws depend on their inputs' values (custom Functions'
    dropouts), the first read only by a later node than the second's reader."""
    g = ir.Graph(name="two_draws")
    x = g.add_value("x", "float32", (4,), kind="user_input")
    g.add_input(x)
    a0, a1, b0, b1, out = (g.add_value(n, "float32", (16,)) for n in ("a0", "a1", "b0", "b1", "out"))
    g.add_node("test.draw", [x], [a0], phase="forward", time_s=0.125, random=True)
    g.add_node("test.draw", [x], [a1], phase="forward", time_s=0.125, random=True)
    g.add_node("test.op", [a1], [b1], phase="forward", time_s=0.125)
    g.add_node("test.op", [a0], [b0], phase="forward", time_s=0.125)
    g.add_node("test.op", [b0, b1], [out], phase="forward", time_s=0.125)
    g.value(out).kind = ir.pb.OUTPUT
    g.add_output(out, "user_output", "out")
    tangent = g.add_value("t", "float32", (16,), kind="gradient")
    g.add_input(tangent, gradient_of=out)
    gb0, gb1, gx = (g.add_value(n, "float32", (16,)) for n in ("gb0", "gb1", "gx"))
    g.add_node("test.op", [tangent, b1], [gb0], phase="backward", time_s=0.125)
    g.add_node("test.op", [tangent, b0, a1], [gb1], phase="backward", time_s=0.125)
    g.add_node("test.op", [gb0, gb1], [gx], phase="backward", time_s=0.125)
    g.add_output(gx, "input_gradient", "x")
    ir.validate(g)
    return g


@pytest.mark.parametrize("share", [0.5, 0.9])
def test_a_draw_depending_on_values_is_not_grouped_behind_a_later_one(share):
    """Stage 1 merged the first draw into its only reader, placed after the second draw's
    reader: every plan ran the second draw first, an invalid schedule raised from inside
    (a random network of two custom Function dropouts, by soak; hiremate, which starts
    from Fast SA's plan, failed with it). Now a valid plan or a refusal naming one."""
    graph = _two_value_draws()
    budget = int(share * ir.store_all(graph).predicted_peak_bytes)
    try:
        schedule = solvers.solve(graph, budget, "fastsa", iterations=4000)
    except solvers.InfeasibleBudget as refused:
        schedule, budget = refused.schedule, refused.smallest_feasible
    result = ir.simulate(graph, schedule)
    assert result.valid, result.violation
    assert result.peak_bytes <= budget
