"""Moving recomputations to their first readers and the forward into eager's order
(`solvers/placement.py`): the plan stays valid, computes the same steps, and its peak
never rises."""

from __future__ import annotations

import random
from collections import Counter

from builders import user_output
from exactness import random_schedule
from hypothesis import given
from hypothesis import strategies as st
from strategies import search, training_graphs

from remat_ir import ir
from remat_ir.ir import compute_sequence
from remat_ir.solvers.placement import sink_to_readers, sunk_order
from remat_ir.solvers.structure import TrainingGraph


def _first_reader(tg: TrainingGraph, order: list[int], i: int) -> int | None:
    """Where the backward recomputation at `i` is first read (None: not one, or unread)."""
    if i < 0 or order[i] not in tg.forward:
        return None
    for j in range(i + 1, len(order)):
        if order[j] == order[i]:
            return None
        if order[i] in tg.node_inputs(order[j]):
            return j
    return None


def _assert_forward_in_eager_order(planned: list[int], forward: list[int]) -> None:
    """The forward's steps run more than once stay where the plan put them; between them
    (and around them) its other steps are the plan's, in the graph's order."""
    repeated = {n for n, count in Counter(planned).items() if count > 1}
    fixed = [i for i, n in enumerate(planned) if n in repeated]
    assert [i for i, n in enumerate(forward) if n in repeated] == fixed, (planned, forward)
    for start, end in zip([-1] + fixed, fixed + [len(planned)]):
        assert forward[start + 1:end] == sorted(planned[start + 1:end]), (planned, forward)


def _unread_recomputations(tg: TrainingGraph, order: list[int], start: int) -> bool:
    return any(order[i] in tg.forward and _first_reader(tg, order, i) is None
               for i in range(start, len(order)))


@search(60)
@given(graph=training_graphs(), seed=st.integers(0, 2**16))
def test_sinking_keeps_the_steps_and_never_raises_the_peak(graph, seed):
    """Random valid schedules (random recomputations, placed anywhere before their
    readers): the same steps, the same time, a peak no higher; every move is kept when
    that keeps the peak, and then only recomputations lie between a recomputation and
    its first reader."""
    tg = TrainingGraph(graph)
    schedule = random_schedule(graph, random.Random(seed), recompute_share=0.5)
    before = ir.simulate(graph, schedule)
    sunk = sink_to_readers(tg, schedule)
    after = ir.simulate(graph, sunk)
    assert after.valid, after.violation
    assert after.peak_bytes <= before.peak_bytes
    assert sunk.predicted_peak_bytes == after.peak_bytes
    assert Counter(compute_sequence(sunk)) == Counter(compute_sequence(schedule))
    assert after.total_time_s == before.total_time_s

    start = ir.forward_length(schedule)
    order = sunk_order(tg, compute_sequence(schedule), start)
    _assert_forward_in_eager_order(compute_sequence(schedule)[:start], order[:start])
    # A recomputation no step reads (random schedules make some, solvers do not) may end
    # up read by a recomputation moved past it, and then stays where it was.
    if not _unread_recomputations(tg, compute_sequence(schedule), start):
        for i in range(start, len(order)):
            reader = _first_reader(tg, order, i)
            if reader is not None:
                assert set(order[i + 1:reader]) <= set(tg.forward), (order, i, reader)
    try:
        everything_moved = ir.simulate(graph, ir.from_compute_sequence(graph, order, start, name="o"))
    except ir.InvalidSchedule:
        everything_moved = None
    if everything_moved is not None and everything_moved.peak_bytes <= before.peak_bytes:
        assert compute_sequence(sunk) == order


def _chain(big: int):
    """in -> x (big) -> r (4 bytes) in the forward; the backward makes `big` bytes of its
    own before reading r."""
    g = ir.Graph(name="chain")
    inp = g.add_value("in", "float32", (1,), kind="parameter")
    g.add_input(inp)
    x = g.add_value("x", "float32", (big // 4,))
    g.add_node("test.op", [inp], [x], phase="forward", time_s=1)
    r = g.add_value("r", "float32", (1,))
    g.add_node("test.op", [x], [r], phase="forward", time_s=1)
    _, tangent = user_output(g, [r])
    y = g.add_value("y", "float32", (big // 4,))
    g.add_node("test.op", [tangent], [y], phase="backward", time_s=1)
    grad = g.add_value("grad", "float32", (1,))
    g.add_node("test.op", [y, r], [grad], phase="backward", time_s=1)
    g.add_output(grad, "parameter_gradient", "in")
    ir.validate(g)
    return g


def test_a_recomputation_moves_next_to_its_reader_unless_that_raises_the_peak():
    """The backward recomputes x then r, then makes y, then reads r. Moving r's
    recomputation after y's step frees r's 4 bytes over y's step but holds x (its input,
    whose last reader it was) there: kept where x is small, refused where x is big."""
    for big, moves in ((4, True), (4000, False)):
        g = _chain(big)
        tg = TrainingGraph(g)
        x, r, y = 0, 1, 3
        sequence = [0, 1, 2, x, r, y, 4]
        schedule = ir.from_compute_sequence(g, sequence, 3, name="early")
        sunk = sink_to_readers(tg, schedule)
        expected = [0, 1, 2, y, x, r, 4] if moves else sequence   # x follows r
        assert compute_sequence(sunk) == expected, big
        assert sunk.predicted_peak_bytes <= schedule.predicted_peak_bytes


def _two_units():
    """x -> h1 = f(x, t1) -> h2 = f(h1, t2) -> out, where t1 and t2 read a parameter alone
    (as a Linear's weight transpose does), in the graph's (eager's) order t1, h1, t2, h2."""
    g = ir.Graph(name="units")
    x = g.add_value("x", "float32", (64,), kind="user_input")
    g.add_input(x)
    made = {}
    h = x
    for k in (1, 2):
        w = g.add_value(f"w{k}", "float32", (1,), kind="parameter")
        g.add_input(w)
        t = g.add_value(f"t{k}", "float32", (1,))
        made[f"t{k}"] = g.add_node("test.op", [w], [t], phase="forward", time_s=1)
        out = g.add_value(f"h{k}", "float32", (64,))
        made[f"h{k}"] = g.add_node("test.op", [h, t], [out], phase="forward", time_s=1)
        made[f"w{k}"], made[f"tv{k}"], made[f"hv{k}"] = w, t, out
        h = out
    _, tangent = user_output(g, [h])
    g1 = g.add_value("g1", "float32", (64,), kind="gradient")
    g.add_node("test.op", [tangent, made["hv1"], made["tv2"]], [g1], phase="backward", time_s=2)
    for k in (1, 2):
        grad = g.add_value(f"grad{k}", "float32", (1,), kind="gradient")
        g.add_node("test.op", [g1, made[f"tv{k}"]], [grad], phase="backward", time_s=2)
        g.add_output(grad, "parameter_gradient", f"w{k}")
    ir.validate(g)
    return g, made


def test_a_forward_step_computed_early_moves_to_its_place_in_eagers_order():
    """A plan that computes unit 2's parameter-only step before unit 1's (the same time and
    peak in the model; FSDP then gathers both units at once) runs it after unit 1, as
    eager does; a step the forward runs twice stays where the plan put it."""
    g, ids = _two_units()
    tg = TrainingGraph(g)
    t1, h1, t2, h2 = ids["t1"], ids["h1"], ids["t2"], ids["h2"]
    out, rest = h2 + 1, list(range(h2 + 2, len(g.proto.nodes)))
    early = ir.from_compute_sequence(g, [t1, t2, h1, h2, out] + rest, 5, name="early")
    sunk = sink_to_readers(tg, early)
    assert compute_sequence(sunk) == [t1, h1, t2, h2, out] + rest
    assert sunk.predicted_peak_bytes <= early.predicted_peak_bytes
    assert ir.simulate(g, sunk).total_time_s == ir.simulate(g, early).total_time_s
    # t1 run twice in the forward: both copies stay, and nothing moves past one.
    twice = [t1, t2, h1, t1, h2, out] + rest
    assert sunk_order(tg, twice, 6) == [t1, h1, t2, t1, h2, out] + rest
    twice = [t2, t1, h1, t1, h2, out] + rest
    assert sunk_order(tg, twice, 6) == twice


def test_a_forward_with_every_weight_transposed_first_runs_module_by_module():
    """The FSDP test's six units (`distributed_runs._Layers`), lowered: a plan that computes
    every weight's transpose (they read parameters alone) before anything else, as
    hiremate's did for some of them at the same predicted time and peak as eager's order
    (FSDP then held three units gathered at once), runs its forward module by module,
    each once, as eager does."""
    import torch
    from distributed_runs import _Layers

    from remat_ir.lowering import lower_torch

    torch.manual_seed(0)
    graph = lower_torch(_Layers(), (torch.randn(64, 256), torch.randn(64, 1)), cost_model="flops")
    tg = TrainingGraph(graph)
    everything = ir.store_all(graph)
    sequence, start = compute_sequence(everything), ir.forward_length(everything)
    resident = set(graph.resident_value_ids)
    alone = [n for n in sequence[:start] if all(v in resident for v in graph.node(n).inputs)]
    early = ir.from_compute_sequence(
        graph, alone + [n for n in sequence[:start] if n not in alone] + sequence[start:], start,
        name="early")

    def modules(schedule):
        runs = []
        for step in schedule.steps[:schedule.backward_start]:
            if step.HasField("compute"):
                module = graph.node(step.compute).source.split(" (")[0]
                if not runs or runs[-1] != module:
                    runs.append(module)
        return runs

    assert len(alone) == 7 and len(modules(early)) > len(set(modules(early)))
    sunk = sink_to_readers(tg, early)
    assert len(modules(sunk)) == len(set(modules(sunk))), modules(sunk)
    assert sunk.predicted_peak_bytes <= early.predicted_peak_bytes
