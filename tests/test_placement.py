"""Moving recomputations to their first readers (`solvers/placement.py`): the plan stays
valid, computes the same steps, and its peak never rises."""

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
from remat_ir.solvers.placement import sink_recomputations, sunk_order
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
    sunk = sink_recomputations(tg, schedule)
    after = ir.simulate(graph, sunk)
    assert after.valid, after.violation
    assert after.peak_bytes <= before.peak_bytes
    assert sunk.predicted_peak_bytes == after.peak_bytes
    assert Counter(compute_sequence(sunk)) == Counter(compute_sequence(schedule))
    assert after.total_time_s == before.total_time_s

    start = ir.forward_length(schedule)
    order = sunk_order(tg, compute_sequence(schedule), start)
    assert order[:start] == compute_sequence(schedule)[:start]
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
        sunk = sink_recomputations(tg, schedule)
        expected = [0, 1, 2, y, x, r, 4] if moves else sequence   # x follows r
        assert compute_sequence(sunk) == expected, big
        assert sunk.predicted_peak_bytes <= schedule.predicted_peak_bytes
