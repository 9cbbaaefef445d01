"""Property tests on random forward/backward DAGs (hypothesis).

The store-everything schedule must be valid and its simulated peak must equal
a calculation from value lifetimes that shares no code with the simulator;
randomly broken schedules must be rejected with the violation predicted here.
"""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st
from strategies import search, training_graphs

from remat_ir import ir
from remat_ir.ir import pb

SETTINGS = search(150)


def lifetime_peak(g: ir.Graph, order: list[int]) -> tuple[int, list[int]]:
    """Peak from storage lifetimes over the compute order; also memory at each position."""
    first_def, last_use = {}, {}
    for pos, n in enumerate(order):
        for v in g.node(n).outputs:
            first_def.setdefault(v, pos)
            last_use[v] = max(last_use.get(v, pos), pos)
        for v in g.node(n).inputs:
            last_use[v] = pos
    end = len(order) - 1
    span = {}  # storage -> [start, stop]
    for v, start in first_def.items():
        stop = end if v in g.output_value_ids else last_use[v]
        s = g.value(v).storage_id
        if s in g.resident_storage_ids:
            continue
        lo, hi = span.get(s, (start, stop))
        span[s] = (min(lo, start), max(hi, stop))
    memory = [sum(g.storage_bytes(s) for s, (lo, hi) in span.items() if lo <= pos <= hi)
              + g.node(n).cost.workspace_bytes for pos, n in enumerate(order)]
    return max(memory), memory


@SETTINGS
@given(training_graphs())
def test_store_all_is_valid_and_its_peak_is_the_lifetime_peak(g):
    schedule = ir.store_all(g)
    result = ir.check(g, schedule)
    order = [s.compute for s in schedule.steps if s.HasField("compute")]
    assert order == g.forward_then_backward()
    peak, _ = lifetime_peak(g, order)
    assert result.peak_bytes == peak
    assert result.recomputations == 0


@SETTINGS
@given(training_graphs())
def test_recompute_all_is_valid_and_saves_nothing(g):
    schedule = ir.recompute_all(g)
    result = ir.check(g, schedule)
    assert result.saved_value_ids == []
    # The caller holds the user outputs: recomputing a node that makes only those gains nothing.
    user_outputs = {o.value_id for o in g.proto.outputs if o.role == pb.USER_OUTPUT}
    user_output_nodes = {n for n in g.nodes if set(g.node(n).outputs) <= user_outputs}
    recomputed = {s.compute for s in schedule.steps[schedule.backward_start:] if s.HasField("compute")}
    assert not (user_output_nodes & recomputed & set(g.phase_order(pb.FORWARD)))


@SETTINGS
@given(training_graphs())
def test_graphs_round_trip_through_both_encodings(g):
    assert ir.loads(ir.dumps(g)).proto == g.proto
    assert ir.loads(ir.dumps_json(g).encode()).proto == g.proto


def _with_steps(schedule, steps, backward_start):
    broken = pb.Schedule()
    broken.CopyFrom(schedule)
    del broken.steps[:]
    broken.steps.extend(steps)
    broken.backward_start = backward_start
    return broken


def _store_all_and_a_free_step(g, data):
    """The store-all schedule, its steps, and the index of one free step drawn at random."""
    schedule = ir.store_all(g)
    steps = list(schedule.steps)
    frees = [k for k, s in enumerate(steps) if s.HasField("free")]
    assume(frees)
    return schedule, steps, data.draw(st.sampled_from(frees))


@SETTINGS
@given(training_graphs(), st.data())
def test_early_free_is_caught_at_the_next_use(g, data):
    schedule, steps, k = _store_all_and_a_free_step(g, data)
    v = steps[k].free
    d = next(i for i, s in enumerate(steps) if s.HasField("compute") and v in g.node(s.compute).outputs)
    moved = steps[:k] + steps[k + 1:]
    moved.insert(d + 1, steps[k])
    bs = schedule.backward_start + (1 if k >= schedule.backward_start > d else 0)
    readers = [i for i in range(d + 2, len(moved))
               if moved[i].HasField("compute") and v in g.node(moved[i].compute).inputs]
    assume(readers)
    violation = ir.simulate(g, _with_steps(schedule, moved, bs)).violation
    assert (violation.kind, violation.step, violation.value_id) == ("input_not_live", readers[0], v)
    assert violation.node_id == moved[readers[0]].compute


@SETTINGS
@given(training_graphs(), st.data())
def test_missing_compute_is_caught(g, data):
    schedule = ir.store_all(g)
    steps = list(schedule.steps)
    computes = [k for k, s in enumerate(steps) if s.HasField("compute")]
    k = data.draw(st.sampled_from(computes))
    lost = set(g.node(steps[k].compute).outputs)
    remaining = steps[:k] + steps[k + 1:]
    bs = schedule.backward_start - (1 if k < schedule.backward_start else 0)
    expected = None
    forward_outputs = {o.value_id for o in g.proto.outputs if o.role == pb.USER_OUTPUT}
    for i, s in enumerate(remaining + [None]):
        if i == bs and lost & forward_outputs:
            expected = ("output_missing", i, min(lost & forward_outputs))
            break
        if s is None:
            expected = ("output_missing", i, None)
            break
        if s.HasField("compute"):
            read = [v for v in g.node(s.compute).inputs if v in lost]
            if read:
                expected = ("input_not_live", i, read[0])
                break
        elif s.free in lost:
            expected = ("free_not_live", i, s.free)
            break
    violation = ir.simulate(g, _with_steps(schedule, remaining, bs)).violation
    assert violation is not None
    got = (violation.kind, violation.step, violation.value_id)
    if expected[2] is None:  # some graph output is gone at the end
        assert got[:2] == expected[:2] and got[2] in lost
    else:
        assert got == expected


@SETTINGS
@given(training_graphs(), st.data())
def test_double_free_is_caught(g, data):
    schedule, steps, k = _store_all_and_a_free_step(g, data)
    doubled = steps[:k + 1] + [steps[k]] + steps[k + 1:]
    bs = schedule.backward_start + (1 if k < schedule.backward_start else 0)
    violation = ir.simulate(g, _with_steps(schedule, doubled, bs)).violation
    assert (violation.kind, violation.step, violation.value_id) == ("free_not_live", k + 1, steps[k].free)


@SETTINGS
@given(training_graphs())
def test_budget_just_below_the_peak_fails_where_the_peak_is_first_reached(g):
    schedule = ir.store_all(g)
    order = [s.compute for s in schedule.steps if s.HasField("compute")]
    peak, memory = lifetime_peak(g, order)
    assume(peak > 0)
    compute_steps = [k for k, s in enumerate(schedule.steps) if s.HasField("compute")]
    first = compute_steps[memory.index(peak)]
    violation = ir.simulate(g, schedule, budget=peak - 1).violation
    assert (violation.kind, violation.step) == ("budget_exceeded", first)
    assert ir.simulate(g, schedule, budget=peak).valid


@SETTINGS
@given(training_graphs(), st.sampled_from([3, 64, 512]), st.integers(0, 2**32))
def test_an_allocation_granularity_counts_every_storage_at_its_rounded_size(g, granularity, seed):
    """With `allocation_granularity_bytes` (a CUDA caching allocator's 512), any schedule
    peaks where it would on the same graph with every storage's size rounded up and none;
    the rounded peak is never below the exact one."""
    import random

    from exactness import random_schedule

    schedule = random_schedule(g, random.Random(seed))
    coarse, rounded = pb.Graph(), pb.Graph()
    coarse.CopyFrom(g.proto)
    coarse.provenance.allocation_granularity_bytes = granularity
    rounded.CopyFrom(g.proto)
    for storage in rounded.storages:
        storage.size_bytes = -(-storage.size_bytes // granularity) * granularity
    peak = ir.simulate(ir.Graph(coarse), schedule).peak_bytes
    assert peak == ir.simulate(ir.Graph(rounded), schedule).peak_bytes >= ir.simulate(g, schedule).peak_bytes
