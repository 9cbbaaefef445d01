"""Offloading: the planner on random graphs, and offloaded schedules of real models
training exactly like eager.

- Random round trips (offload, free, prefetch at random places in a value's idle
  gaps) inserted in random valid schedules of real graphs: bitwise equal to eager on
  CPU, where an offload is a copy into a host buffer.
- The zoo at 30% (or the lowest peak reached) planned with offloading, and offloaded
  alone: exact, within the budget.
- On random graphs and links: rematerialization with offloading (and pofo) is never
  predicted slower than rematerialization alone at the same budget, and reaches at
  least as low.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import assume, example, given
from hypothesis import strategies as st

import remat_ir
from remat_ir import ir, solvers
from remat_ir.ir import pb
from remat_ir.ir.gradient_sums import gradient_chains, handed_sum_values, moved_sums
from remat_ir.ir.schedules import store_all
from remat_ir.lowering import lower_torch
from remat_ir.runtimes.memory import measure_peak
from remat_ir.runtimes.torch import ScheduledModule, resident_values
from remat_ir.runtimes.transfer_calibration import (ROUND_TRIPS, calibrate_issue_seconds, fit_issue_seconds,
                                                    round_trip_schedule)
from remat_ir.runtimes.transfers import measure_link
from remat_ir.runtimes.profiling import priced_for
from remat_ir.solvers.offload import (REFINE_LEVELS, RoundTrip, add_offloads, coarse_rungs, describe_link, idle_gaps,
                                     idle_recomputations, plan_with_offload, with_round_trips)

from slow import some_slow
import zoo
import zoo_models
from builders import chain
from exactness import DEVICES, INSTANT, SEARCH_MODELS, lowered, random_round_trips, random_schedule, side_by_side
from random_networks import RandomNet, programs
from strategies import search, training_graphs


def own_copy(name: str) -> ir.Graph:
    """The session's lowered zoo model as a graph of its own: the links, prices and plans
    a test sets stay out of the graph other tests share (`lowered` is cached)."""
    proto = pb.Graph()
    proto.CopyFrom(lowered(name).proto)
    return ir.Graph(proto)


@pytest.mark.parametrize("name", SEARCH_MODELS)
@search(6, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1), share=st.sampled_from([0.1, 0.5, 1.0]),
       groups=st.sampled_from([1, 64]))
def test_random_offloads_in_random_schedules_match_eager(name, seed, share, groups):
    graph = lowered(name)
    rnd = random.Random(seed)
    schedule = random_round_trips(graph, random_schedule(graph, rnd), rnd, share)
    assert any(s.HasField("offload") for s in schedule.steps)
    model, args, kwargs, loss_of = zoo_models.ZOO[name]()
    errors = side_by_side(model, lambda m: ScheduledModule(m, graph, schedule, gradient_groups=groups),
                          args, kwargs, loss_of, steps=2)
    assert errors == {}, f"not bitwise equal to eager: {errors}"


@pytest.mark.parametrize("name", SEARCH_MODELS)
@search(4, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1), share=st.sampled_from([0.5, 1.0]))
def test_random_offloads_peak_where_the_simulator_says_at_every_step(name, seed, share):
    """On CPU a host buffer is ordinary memory, allocated once at the first step and reused
    by every later one: from the second step on, what a step allocates is the device side
    alone (a value's memory goes when it is freed after its offload and comes back at its
    prefetch), which must be the simulated peak to within 64 B at every step, as without
    offloads. The Hugging Face models' loss leaves their logits out: the backward generated
    for such a loss had a host pool of its own, so the forward allocated new buffers at
    every step (GPT-2: 24 KB more a step; pinned memory on CUDA). The step holds the
    model's outputs until its backward is done, as the simulator assumes a caller does."""
    graph = lowered(name, "isolated")   # real storage sizes and workspaces
    rnd = random.Random(seed)
    schedule = random_round_trips(graph, random_schedule(graph, rnd), rnd, share)
    assert any(s.HasField("offload") for s in schedule.steps)
    model, args, kwargs, loss_of = zoo_models.ZOO[name]()
    scheduled = ScheduledModule(model, graph, schedule)

    def step():
        out = scheduled(*args, **kwargs)
        loss_of(out).backward()
        del out

    measured = []
    for _ in range(3):
        scheduled.zero_grad(set_to_none=True)
        measured.append(measure_peak(step, "cpu").peak_bytes)
    simulated = ir.simulate(graph, schedule).peak_bytes
    assert all(abs(m - simulated) <= 64 for m in measured[1:]), (measured, simulated)


class _SharedBlock(torch.nn.Module):
    """One block applied three times (ALBERT's sharing): its weight's gradient is a chain
    of three parts, which the runtime hands to autograd one by one."""

    def __init__(self, d: int = 16, h: int = 32):
        super().__init__()
        self.inp, self.block = torch.nn.Linear(d, h), torch.nn.Linear(h, h)
        self.ln, self.out = torch.nn.LayerNorm(h), torch.nn.Linear(h, 8)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        for _ in range(3):
            h = self.ln(h + torch.relu(self.block(h)))
        return self.out(h).mean(1)


@pytest.mark.parametrize("solver", some_slow(["rotor", "hiremate"], ["hiremate"]))
def test_offloading_never_moves_a_running_gradient_sum(solver):
    """A shared weight's running gradient sum was offloaded (rotor with offloading at 37%):
    the runtime then handed that gradient over whole, and where the weight also got
    gradient from outside the module (the module called twice before one backward, an
    L2 penalty) it rounded otherwise than eager's, silently (bfloat16: 4.9e-4 off; found
    by a review). Sums are not offloaded now, nor recomputed over idle gaps; at every
    budget the plans offload something and train bitwise like eager with a penalty in
    the loss."""
    torch.manual_seed(0)
    model, x = _SharedBlock(), torch.randn(4, 64, 16)
    graph = lower_torch(model, (x,), cost_model="flops")
    describe_link(graph, "100GB/s")
    sums = handed_sum_values(graph)
    assert sums, "the shared weight's gradient is a chain of sums"
    peak = ir.store_all(graph).predicted_peak_bytes
    offloading = 0
    for share in (0.37, 0.45, 0.6):
        try:
            schedule = solvers.solve(graph, int(share * peak), solver, offload=True)
        except solvers.InfeasibleBudget as refused:
            schedule = refused.schedule
        moved = {getattr(s, s.WhichOneof("action")) for s in schedule.steps
                 if s.WhichOneof("action") in ("offload", "prefetch")}
        assert not moved & sums, f"{share:.0%}: {schedule.name} moves running sums {moved & sums}"
        offloading += bool(moved)
        errors = side_by_side(model, lambda m: ScheduledModule(m, graph, schedule), (x,), {},
                              lambda out: out.square().mean(), steps=2)
        assert errors == {}, f"{share:.0%}: {schedule.name} not bitwise equal to eager: {errors}"
    assert offloading, "no plan offloads anything: the test checks nothing"


def _moving_a_running_sum(graph: ir.Graph, schedule: pb.Schedule) -> pb.Schedule:
    """`schedule` with a round trip of the running sum of `block.weight`'s first two parts."""
    steps = list(schedule.steps)
    gradient = next(o.value_id for o in graph.proto.outputs if o.name == "block.weight")
    nodes, _ = gradient_chains(graph)[gradient]
    value = graph.node(nodes[0]).outputs[0]
    made = next(k for k, s in enumerate(steps) if s.HasField("compute") and s.compute == nodes[0])
    read = next(k for k, s in enumerate(steps)
                if s.HasField("compute") and value in graph.node(s.compute).inputs)
    trip = RoundTrip(value, after=made, free_at=made + 1, prefetch_at=read, use=read,
                     size=graph.storage_bytes(graph.value(value).storage_id))
    moved, _ = with_round_trips(schedule, [trip])
    ir.check(graph, moved)
    return moved


def test_a_schedule_moving_a_running_gradient_sum_is_refused_by_name():
    """A third party's schedule may offload a running sum (the simulator finds it valid):
    the runtime cannot hand that gradient to autograd in eager's order, and says so
    rather than hand it over whole."""
    from remat_ir.runtimes.gradient_parts import MovedGradientSum

    torch.manual_seed(0)
    model, x = _SharedBlock(), torch.randn(2, 8, 16)
    graph = lower_torch(model, (x,), cost_model="flops")
    moved = _moving_a_running_sum(graph, store_all(graph))
    assert moved_sums(graph, moved)
    with pytest.raises(MovedGradientSum, match=r"offloads and prefetches value .* running sum of "
                       r"the gradient of 'block\.weight'.*built-in solver"):
        ScheduledModule(model, graph, moved)(x)


def test_a_cached_plan_moving_a_running_gradient_sum_is_planned_again(tmp_path, capsys):
    """A plan cached by a remat-ir whose offloading moved running sums (before this
    version) is not taken: it would be refused at the first call. It is planned again."""
    torch.manual_seed(0)
    model, x = _SharedBlock(), torch.randn(2, 8, 16)
    options = dict(budget=0.8, solver="rotor", cost_model="flops", offload=True,
                   host_bandwidth="100GB/s", cache_dir=tmp_path)
    first = remat_ir.remat(model, (x,), **options)
    first(x).sum().backward()
    [path] = [p for p in tmp_path.glob("*/*.plan") if not p.name.startswith("floor")]
    stored = pb.Schedule.FromString(path.read_bytes())
    path.write_bytes(_moving_a_running_sum(first.graph, stored).SerializeToString())
    again = remat_ir.remat(model, (x,), **options)
    again(x).sum().backward()
    assert "it moves a running gradient sum" in capsys.readouterr().err
    assert not moved_sums(again.graph, again.schedule)
    assert not moved_sums(first.graph, pb.Schedule.FromString(path.read_bytes()))   # overwritten


class _LazyConjugate(torch.nn.Module):
    """A value the backward reads that is a lazy view: `fft(h).conj()`, which `abs` saves."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x):
        z = torch.fft.fft(self.a(x)).conj().abs()
        return torch.tanh(self.b(z)).sum()


def test_an_offloaded_lazy_conjugate_view_comes_back_conjugate():
    """An offload copies a value's storage and rebuilds the tensor from it: the conjugate
    bit of `fft(h).conj()` (the tensor's, not its bytes') was lost, and the backward read
    the values unconjugated: the first layer's gradients 24 off eager's (found by a
    review), silently. Every idle value of store-everything goes out and back."""
    torch.manual_seed(0)
    model, x = _LazyConjugate(), torch.randn(8, 16)
    graph = lower_torch(model, (x,), cost_model="flops")
    schedule = random_round_trips(graph, store_all(graph), random.Random(0), 1.0)
    assert side_by_side(model, lambda m: ScheduledModule(m, graph, schedule), (x,), {},
                        lambda loss: loss, steps=2) == {}


def random_recomputations(graph: ir.Graph, schedule: pb.Schedule, rnd: random.Random):
    """A random share of the schedule's idle recomputations (at least one) that do not
    free each other's inputs where they run."""
    found = idle_recomputations(graph, schedule)
    rnd.shuffle(found)
    picked = []
    for r in found:
        reads = set(graph.node(r.node).inputs)
        if all(not (c.value in reads and c.after < r.use <= c.use)
               and not (r.value in graph.node(c.node).inputs and r.after < c.use <= r.use)
               for c in picked) and (not picked or rnd.random() < 0.5):
            picked.append(r)
    return picked


@pytest.mark.parametrize("name", SEARCH_MODELS)
@search(4, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_recomputations_of_idle_values_match_eager(name, seed):
    """`add_offloads`' other move: an idle value freed after a read and computed again
    before the next. Random ones in random schedules are valid and train bitwise like
    eager (multi-output producers' other outputs freed at once)."""
    graph = lowered(name)
    rnd = random.Random(seed)
    schedule = random_schedule(graph, rnd)
    picked = random_recomputations(graph, schedule, rnd)
    # A random schedule of the smallest models may recompute all there is (the soak found
    # one of `straight_through`, 2026-12-04); hypothesis fails the test if none keeps any.
    assume(picked)
    moved, _ = with_round_trips(schedule, [], picked)
    before, after = ir.check(graph, schedule), ir.check(graph, moved)
    assert after.recomputations == before.recomputations + len(picked)
    model, args, kwargs, loss_of = zoo_models.ZOO[name]()
    errors = side_by_side(model, lambda m: ScheduledModule(m, graph, moved), args, kwargs, loss_of, steps=2)
    assert errors == {}, f"not bitwise equal to eager: {errors}"


@search(10, derandomize=True)
@given(program=programs(), seed=st.integers(0, 2**32 - 1), share=st.sampled_from([0.1, 0.5, 1.0]),
       recompute=st.booleans())
# Soak, 2026-11-28: diverges in eager too (inf, then NaN gradients in the second step),
# which the comparison counted as a mismatch (`exactness.relative_error`).
@example(program=[("relu", (0,)), ("layer_norm", (0,)), ("relu", (0,)), ("matmul_t", (2, 2)),
                  ("matmul_t", (4, 4)), ("linear", (5,))], seed=0, share=0.1, recompute=False)
# Soak, 2026-11-28: a strided gradient slice copied for a batch-norm backward (4e-8 off
# eager's; `frontends/view_compaction.py`).
@example(program=[("relu", (0,)), ("add", (0, 0)), ("batch_norm", (0,)), ("relu", (0,)), ("layer_norm", (0,)),
                  ("add", (0, 0)), ("cat_linear", (0, 3)), ("linear", (7,))], seed=0, share=0.1, recompute=False)
def test_random_offloads_and_recomputations_in_random_networks_match_eager(program, seed, share,
                                                                          recompute):
    """Both moves of `add_offloads` in random schedules of random networks
    (`random_networks`: views of one allocation, in-place writes, several outputs,
    buffers, draws): valid and bitwise equal to eager."""
    torch.manual_seed(0)
    x = torch.randn(3, 6)
    graph = lower_torch(RandomNet(program, 6), (x,), cost_model="flops")
    rnd = random.Random(seed)
    schedule = random_schedule(graph, rnd, recompute_share=0.3, defer_share=0.5)
    if recompute:
        picked = random_recomputations(graph, schedule, rnd)
        assume(picked)
        schedule, _ = with_round_trips(schedule, [], picked)
        ir.check(graph, schedule)
    else:
        assume(idle_gaps(graph, schedule, link=INSTANT))
        schedule = random_round_trips(graph, schedule, rnd, share)
    torch.manual_seed(0)
    errors = side_by_side(RandomNet(program, 6), lambda m: ScheduledModule(m, graph, schedule), (x,), {},
                          lambda out: out, steps=2)
    assert errors == {}, f"not bitwise equal to eager: {errors}"


@search(8, derandomize=True)
@given(program=programs(), seed=st.integers(0, 2**32 - 1), share=st.sampled_from([0.3, 1.0]))
def test_random_networks_with_random_offloads_measure_the_peak_they_simulate(program, seed, share):
    """Random schedules of random networks with random round trips, wide enough that their
    tensors are not rounding noise and on their real sizes and workspaces ("isolated"):
    from the second step (the host pool then exists), at most 0.5% or 64 B above the
    simulated peak, as the same networks are without offloads (op workspaces vary between
    runs: a masked assignment's with its mask, here 144 B below its simulated figure)."""
    torch.manual_seed(0)
    model, x = RandomNet(program, 64), torch.randn(16, 64)
    graph = lower_torch(model, (x,), cost_model="isolated")
    rnd = random.Random(seed)
    schedule = random_schedule(graph, rnd, recompute_share=0.3, defer_share=0.5)
    assume(idle_gaps(graph, schedule, link=INSTANT))
    schedule = random_round_trips(graph, schedule, rnd, share)
    simulated = ir.simulate(graph, schedule).peak_bytes
    scheduled = ScheduledModule(model, graph, schedule)
    for _ in range(2):
        scheduled.zero_grad(set_to_none=True)
        measured = measure_peak(lambda: scheduled(x).backward(), "cpu").peak_bytes
    assert measured <= simulated + max(64, simulated // 200), (measured, simulated)
    assert measured >= 0.9 * simulated, (measured, simulated)


@search(30, derandomize=True)
@given(graph=training_graphs(), share=st.floats(0.2, 0.9), bandwidth=st.sampled_from([10.0, 1e3, 1e6]))
@example(graph=chain(6)[0], share=0.6, bandwidth=1e6)
def test_recomputing_idle_values_is_never_worse_than_copies_alone(graph, share, bandwidth):
    """`add_offloads` with both moves reaches every budget copies alone reach, never
    slower, and what it returns is valid and within the budget. The example: rounds
    with both moves alone took a recomputation that held an input the last round had
    to move, and got stuck 800 bytes over the budget copies alone met."""
    describe_link(graph, bandwidth, latency_s=1e-3)
    everything = ir.store_all(graph)
    budget = max(1, int(share * everything.predicted_peak_bytes))

    def offloaded(recompute: bool):
        try:
            return add_offloads(graph, everything, budget, recompute=recompute)
        except solvers.InfeasibleBudget:
            return None

    copies, both = offloaded(False), offloaded(True)
    if copies is None:
        return
    assert both is not None, "copies alone reach the budget, both moves do not"
    result = ir.check(graph, both)
    assert result.peak_bytes <= budget
    assert result.total_time_s <= ir.simulate(graph, copies).total_time_s * (1 + 1e-9)


#: Models whose store-everything peak no offload lowers: the straight-through model's is a
#: backward matmul (with buffer reuse) while every live activation is read there or next.
NOTHING_IDLE_AT_PEAK = {"straight_through"}
#: Swept at every budget in `make test` (`test_zoo.py`), so offloaded here only by
#: `make test-all`.
OFFLOADED_IN_TEST_ALL = ("whisper", "lora_gpt2", "llama", "vit", "bert")


@pytest.mark.parametrize("name", some_slow(list(zoo_models.ZOO), OFFLOADED_IN_TEST_ALL))
def test_zoo_offloaded_at_30_percent_is_exact(name):
    """Two plans per model at 30%: rematerialization with offloading (rotor, the fastest
    planner here; the default planner's plans are offloaded the same way,
    `test_offloaded_training_on_device`), which may find offloading slower and not use it,
    and store-everything offloaded alone. Tiny models hold much of their peak in
    gradients, so 30% is often below any plan: then the lowest-peak plan reached is
    trained instead."""
    graph = own_copy(name)
    describe_link(graph, "25GB/s")
    budget = int(0.3 * ir.store_all(graph).predicted_peak_bytes)

    def lowest(plan):
        try:
            return plan()
        except solvers.InfeasibleBudget as refused:
            assert refused.smallest_feasible > budget
            return refused.schedule

    planned = lowest(lambda: solvers.solve(graph, budget, "rotor", offload=True))
    moved = lowest(lambda: add_offloads(graph, ir.store_all(graph), budget))
    assert any(s.HasField("offload") for s in moved.steps) or name in NOTHING_IDLE_AT_PEAK
    for schedule in (planned, moved):
        result = ir.check(graph, schedule)
        assert result.peak_bytes <= max(budget, schedule.predicted_peak_bytes)
        model, args, kwargs, loss_of = zoo_models.ZOO[name]()
        errors = side_by_side(model, lambda m: ScheduledModule(m, graph, schedule), args, kwargs,
                              loss_of, steps=2)
        if name in zoo.REASONS:
            assert max(errors.values(), default=0.0) <= 1e-6
        else:
            assert errors == {}, f"{schedule.name} not bitwise equal to eager: {errors}"


@search(40, derandomize=True)
@given(graph=training_graphs(), share=st.floats(0.2, 1.0), bandwidth=st.sampled_from([10.0, 1e3, 1e6]),
       overlapped=st.booleans(), issue=st.sampled_from([0.0, 0.3]))
def test_offloading_is_never_predicted_slower_than_rematerialization(graph, share, bandwidth,
                                                                     overlapped, issue):
    link = graph.proto.provenance.host_link
    link.bandwidth_bytes_per_s, link.latency_s, link.overlapped = bandwidth, 1e-3, overlapped
    link.issue_s = issue
    budget = max(1, int(share * ir.store_all(graph).predicted_peak_bytes))
    try:
        remat = solvers.solve(graph, budget, "rotor")
    except solvers.InfeasibleBudget as refused:
        remat, floor = None, refused.smallest_feasible
    try:
        moved = solvers.solve(graph, budget, "rotor", offload=True)
    except solvers.InfeasibleBudget as refused:
        assert remat is None, "offloading refused a budget rematerialization reaches"
        assert refused.smallest_feasible is None or floor is None or refused.smallest_feasible <= floor
        return
    result = ir.check(graph, moved)
    assert result.peak_bytes <= budget
    if remat is not None:
        assert result.total_time_s <= remat.predicted_time_s * (1 + 1e-9)
        pofo = ir.check(graph, solvers.solve(graph, budget, "pofo"))
        assert pofo.peak_bytes <= budget
        assert pofo.total_time_s <= remat.predicted_time_s * (1 + 1e-9)


def test_host_budget_bounds_the_copies():
    graph = own_copy("gpt2")
    describe_link(graph, "1TB/s")
    free_hand = solvers.solve(graph, "60%", "rotor", offload=True)
    held = ir.simulate(graph, free_hand).host_peak_bytes
    assert held > 0
    bounded = solvers.solve(graph, "60%", "rotor", offload=True, host_budget=held // 2)
    assert bounded.host_budget_bytes == held // 2
    assert ir.check(graph, bounded).host_peak_bytes <= held // 2


def test_a_refusal_under_a_host_budget_names_it_and_what_its_peak_is():
    """A plan the host budget stops was refused as rematerialization's, naming a
    "smallest feasible budget" a review read as the floor (30% refused naming 52.6%,
    while 45% planned at 44.9%). The refusal says the peak is the lowest its plans
    reached, not a searched floor, and names the host budget where one was given; the
    peak it names plans."""
    graph = own_copy("gpt2")
    describe_link(graph, "1TB/s")
    # Below rotor's floor (57% here), which offloading brings down to 52%.
    free_hand = solvers.solve(graph, "53%", "rotor", offload=True)
    held = ir.simulate(graph, free_hand).host_peak_bytes
    budget = free_hand.budget_bytes
    try:
        solvers.solve(graph, "53%", "rotor", offload=True, host_budget=held // 50)
    except solvers.InfeasibleBudget as refused:
        message = str(refused)
        assert "not a floor searched for" in message, message
        assert f"under a host budget of {held // 50:,} bytes" in message, message
        reached = solvers.solve(graph, refused.smallest_feasible, "rotor", offload=True, host_budget=held // 50)
        assert ir.check(graph, reached).peak_bytes <= refused.smallest_feasible
    else:
        pytest.fail(f"a host budget of {held // 50} bytes (of {held} held at {budget}) planned")


def test_a_floor_an_offloaded_plan_left_serves_only_requests_it_fits():
    """Found by CI: a refused offloaded plan is remembered as the graph's floor, and a
    later request the solver refused took it: one under a host budget its copies exceed
    failed as "returned a schedule the simulator refuses", and one without offloading
    got a plan of 29 copies to the host it never asked for."""
    graph = own_copy("gpt2")
    describe_link(graph, "1TB/s")
    with pytest.raises(solvers.InfeasibleBudget):
        solvers.solve(graph, "45%", "rotor", offload=True)   # below offloading's floor: remembered
    again = own_copy("gpt2")
    describe_link(again, "1TB/s")
    with pytest.raises(solvers.InfeasibleBudget, match="under a host budget of 3,000 bytes"):
        solvers.solve(again, "53%", "rotor", offload=True, host_budget=3000)
    try:
        plain = solvers.solve(again, "53%", "rotor")
    except solvers.InfeasibleBudget:
        return
    assert not any(step.HasField("offload") for step in plain.steps)


@pytest.mark.parametrize("time_limit_s", [0.005, 0.02, 0.1])
def test_a_rung_out_of_its_share_of_the_time_is_no_plan_not_a_failure(time_limit_s):
    """Each rung of the offload ladder gets a share of the time limit; rotor's program over
    GPT-2's stages did not finish within a share, and the whole plan failed with its
    `OutOfTime` (found by a review: "within the time limit of 0.0434 s", a limit the
    caller never set). A plan, or a refusal naming a floor, whatever the shares."""
    graph = own_copy("gpt2")
    describe_link(graph, "25GB/s")
    try:
        planned = solvers.solve(graph, "40%", "rotor", offload=True, time_limit_s=time_limit_s)
    except solvers.InfeasibleBudget as refused:
        assert refused.smallest_feasible is not None
    else:
        assert ir.check(graph, planned).peak_bytes <= planned.budget_bytes


def test_offloading_needs_a_link_and_says_so():
    graph = own_copy("mlp_dropout")
    graph.proto.provenance.ClearField("host_link")
    with pytest.raises(solvers.BadRequest, match="host link's bandwidth.*host_bandwidth='25GB/s'"):
        solvers.solve(graph, "50%", offload=True)
    with pytest.raises(solvers.BadRequest, match="like '25GB/s'; got '25GB'"):
        describe_link(graph, "25GB")
    assert describe_link(graph, "2 GiB/s").bandwidth_bytes_per_s == 2 * 2**30
    with pytest.raises(solvers.BadRequest, match="host budget: budget '64' has no unit"):
        solvers.solve(graph, "50%", offload=True, host_budget="64")


def test_a_host_budget_without_offloading_is_refused_before_lowering():
    """It was ignored, the plan offloading nothing, without a word (found by a review)."""
    with pytest.raises(solvers.BadRequest, match=r"host_budget='1GB' bounds the host memory "
                                                 r"offloading uses, and offloading is off: pass offload=True"):
        remat_ir.remat(torch.nn.Linear(4, 4), torch.randn(2, 4), budget=0.5, host_budget="1GB")


def test_offload_with_a_solver_that_offloads_itself_is_refused_before_planning():
    """pofo's plans move values themselves: `offload=True` with it was refused from inside
    the ladder (`schedule 'pofo' already moves values to the host`), and only at budgets
    where its plan had moves. Now at once, from `solve` and from `remat`, saying what to do."""
    from remat_ir import remat

    graph = own_copy("gpt2")
    describe_link(graph, "1TB/s")
    with pytest.raises(solvers.BadRequest, match="solver 'pofo' plans offloads itself.*without offload"):
        solvers.solve(graph, "70%", "pofo", offload=True)
    assert all(s.solver != "pofo" for s in graph.proto.schedules)
    alone = solvers.solve(graph, "70%", "pofo")   # alone, it plans, and its plan moves values
    assert any(s.HasField("offload") for s in alone.steps)
    with pytest.raises(solvers.BadRequest, match="solver 'pofo' plans offloads itself"):
        remat(torch.nn.Linear(4, 4), (torch.randn(2, 4),), budget=0.5, solver="pofo", offload=True)


@pytest.mark.parametrize("device", DEVICES)
def test_offloaded_training_on_device(device, capfd):
    """`remat(..., offload=True)` on the device: exact against eager there, with the link
    measured; on CUDA the measured peak is within 5% of the simulated one."""
    from remat_ir import remat

    model, args, kwargs, loss_of = zoo_models.ZOO["gpt2"]()
    model, args = model.to(device), tuple(a.to(device) for a in args)
    kwargs = {k: v.to(device) for k, v in kwargs.items()}
    # The ladder's dozen plans share the call's time limit, as a user's would: without one
    # each plan takes what it needs (40 s in all here).
    try:
        scheduled = remat(model, args, example_kwargs=kwargs, budget="60%", offload=True,
                          cost_model="isolated", time_limit_s=10)
    except solvers.InfeasibleBudget as exc:
        # CUDA's 512-byte blocks raise this tiny graph's floor (66.6% on an H100): plan at
        # the floor the refusal names.
        assert device == "cuda", exc
        scheduled = remat(model, args, example_kwargs=kwargs, budget=exc.smallest_feasible,
                          offload=True, cost_model="isolated", time_limit_s=10)
    if device == "cpu":
        assert "saves no memory there" in capfd.readouterr().err
    link = scheduled.graph.proto.provenance.host_link
    assert link.source == "measured" and link.bandwidth_bytes_per_s > 0
    assert link.overlapped == (device == "cuda")
    result = ir.simulate(scheduled.graph, scheduled.schedule)
    assert result.valid and result.peak_bytes <= scheduled.schedule.budget_bytes
    # The plan just made, run on a fresh copy of the model (planning again would double
    # the test's time: the ladder makes a dozen plans).
    errors = side_by_side(model, lambda m: ScheduledModule(m, scheduled.graph, scheduled.schedule),
                          args, kwargs, loss_of, steps=2)
    assert max(errors.values(), default=0.0) <= (0 if device == "cpu" else 1e-5), errors
    if device == "cuda":  # the memory effect: a CPU "device" holds the host copies too
        def step():
            # The outputs held through the backward, as the simulator assumes a caller
            # does: dropped before it (a temporary here before), the logits' 16 KB are
            # freed early and the step peaked 8.4% below its simulated figure (H200).
            out = scheduled(*args, **kwargs)
            loss_of(out).backward()
            del out

        step()
        scheduled.zero_grad(set_to_none=True)
        measured = measure_peak(step, device).peak_bytes
        if 0.05 * result.peak_bytes < abs(measured - result.peak_bytes) <= 0.065 * result.peak_bytes:
            # Known (H100, torch 2.11): 203,776 bytes against 191,488 simulated (+6.4%) on this
            # tiny GPT-2, after the exactness above passed; the quick GPT-2's offloaded plans
            # measured within 1.4% (benchmarks/results/time_model/20261126-101432-cuda.md).
            pytest.xfail(f"known CUDA peak gap on a tiny graph: measured {measured}, "
                         f"simulated {result.peak_bytes}")
        assert abs(measured - result.peak_bytes) <= 0.05 * result.peak_bytes, (measured, result)


@pytest.mark.parametrize("overlapped", [True, False])
def test_each_transfer_costs_the_compute_timeline_its_issue_time(overlapped):
    """On a link with no latency and endless bandwidth, a schedule's time with offloads is
    its time without them plus the host's `issue_s` per transfer, on either kind of link."""
    graph = own_copy("gpt2")
    rnd = random.Random(7)
    schedule = random_round_trips(graph, random_schedule(graph, rnd), rnd, 0.5)
    transfers = sum(s.HasField("offload") or s.HasField("prefetch") for s in schedule.steps)
    link = graph.proto.provenance.host_link
    link.CopyFrom(INSTANT)
    link.overlapped = overlapped
    plain = ir.simulate(graph, schedule)
    link.issue_s = 1e-3
    issued = ir.simulate(graph, schedule)
    assert transfers and max(issued.stall_s, plain.stall_s) < 1e-9
    assert issued.total_time_s == pytest.approx(plain.total_time_s + transfers * 1e-3, abs=1e-9)


def test_measured_cpu_link_is_a_memcpy():
    link = measure_link(torch.device("cpu"), nbytes=1 << 20, repeats=2)
    assert link["bandwidth_bytes_per_s"] > 0 and link["latency_s"] >= 0 and not link["overlapped"]
    assert link["issue_s"] > 0


def test_the_host_link_is_measured_once_per_process_and_device(monkeypatch):
    """Every lowering records the link (`add_costs`); the copies that time it run once
    per device, and a caller changing the fields it got changes no later graph's."""
    from remat_ir.runtimes import transfers
    monkeypatch.setattr(transfers, "_LINKS", {})
    measured = []
    real = transfers.measure_link
    monkeypatch.setattr(transfers, "measure_link", lambda device: measured.append(device) or real(
        device, nbytes=1 << 16, repeats=1))
    first = transfers.host_link(torch.device("cpu"))
    first["bandwidth_bytes_per_s"] = -1.0
    second = transfers.host_link("cpu")
    assert measured == [torch.device("cpu")] and second["bandwidth_bytes_per_s"] > 0
    from remat_ir.lowering import add_costs
    graph = add_costs(own_copy("gpt2"), "isolated", "cpu")
    assert measured == [torch.device("cpu")]
    assert graph.proto.provenance.host_link.bandwidth_bytes_per_s == second["bandwidth_bytes_per_s"]


def test_pofo_offloads_exactly_and_is_never_slower_than_rotor():
    graph = own_copy("gpt2")
    describe_link(graph, "1TB/s")
    budget = int(0.7 * ir.store_all(graph).predicted_peak_bytes)
    alone = solvers.solve(graph, budget, "rotor")
    schedule = solvers.solve(graph, budget, "pofo")
    result = ir.check(graph, schedule)
    assert result.peak_bytes <= budget and result.total_time_s <= alone.predicted_time_s
    assert any(s.HasField("offload") for s in schedule.steps)
    model, args, kwargs, loss_of = zoo_models.ZOO["gpt2"]()
    errors = side_by_side(model, lambda m: ScheduledModule(m, graph, schedule), args, kwargs,
                          loss_of, steps=2)
    assert errors == {}, errors


def _offloaded_from_every_start(graph: ir.Graph, budget: int, refine_levels: int):
    """plan_with_offload on rotor's plans, with each budget it asked rotor for and each
    rotor plan it started from."""
    asked, starts = [], [ir.store_all(graph)]

    def remat(b: int) -> pb.Schedule:
        asked.append(b)
        try:
            starts.append(solvers.solve(graph, b, "rotor"))
        except solvers.InfeasibleBudget as refused:
            if refused.schedule is not None:
                starts.append(refused.schedule)
            raise
        return starts[-1]

    planned = plan_with_offload(graph, budget, remat, refine_levels=refine_levels)
    return planned, asked, starts


def test_the_ladder_is_refined_around_its_fastest_rung_and_the_fastest_plan_is_kept():
    """Tiny Llama priced for a GPU, at 80% over a link that moves three store-everything
    peaks per step: the coarse ladder's best rung is not the best budget; the rungs
    halfway to its neighbours find a faster plan. Whatever the levels, the plan is the
    fastest of every start offloaded down to the budget."""
    graph = priced_for(own_copy("llama"), "cuda")
    everything = ir.store_all(graph)
    describe_link(graph, 3 * everything.predicted_peak_bytes / everything.predicted_time_s)
    budget = int(0.8 * everything.predicted_peak_bytes)
    times = {}
    for levels in (0, REFINE_LEVELS):
        planned, asked, starts = _offloaded_from_every_start(graph, budget, levels)
        result = ir.check(graph, planned)
        assert result.peak_bytes <= budget
        times[levels] = result.total_time_s
        fastest = float("inf")
        for start in starts:
            try:
                fastest = min(fastest, ir.simulate(graph, add_offloads(graph, start, budget)).total_time_s)
            except solvers.InfeasibleBudget:
                pass
        assert result.total_time_s == fastest
        coarse = coarse_rungs(budget, everything.predicted_peak_bytes)
        assert asked[:len(coarse)] == coarse
        assert len(asked) > len(coarse) if levels else asked == coarse
    assert times[REFINE_LEVELS] < times[0] * (1 - 1e-3)


def test_a_time_limit_bounds_the_whole_ladder_not_each_plan():
    """With a time limit, each plan is asked for with a share of the time left and a
    plan that spends its whole share (here: rotor, then a sleep to the end of its share)
    leaves the ladder within the limit; with no time left, no plan is asked for. The
    offloading between plans is not bounded by the limit: on a loaded 2-core machine it
    added up to 0.8 s, so the ladder may take twice the limit. How many plans fit depends
    on how long that offloading takes (CI once fitted only two), so what is checked is
    the first share: the limit over every plan the ladder may make, not the whole limit."""
    import time

    graph = priced_for(own_copy("llama"), "cuda")
    everything = ir.store_all(graph)
    describe_link(graph, 3 * everything.predicted_peak_bytes / everything.predicted_time_s)
    budget = int(0.8 * everything.predicted_peak_bytes)
    limit, shares = 2.0, []

    def remat(b: int, *, time_limit_s: float) -> pb.Schedule:
        started = time.monotonic()
        shares.append(time_limit_s)
        schedule = solvers.solve(graph, b, "rotor")
        time.sleep(max(0.0, time_limit_s - (time.monotonic() - started)))
        return schedule

    started = time.monotonic()
    planned = plan_with_offload(graph, budget, remat, time_limit_s=limit)
    elapsed = time.monotonic() - started
    assert ir.check(graph, planned).peak_bytes <= budget
    plans = len(coarse_rungs(budget, everything.predicted_peak_bytes)) + 2 * REFINE_LEVELS
    assert shares and shares[0] <= limit / plans
    assert all(0 < share < limit for share in shares) and sum(shares) <= limit
    assert elapsed <= 2 * limit, f"{elapsed:.2f} s under a {limit} s limit"
    shares.clear()
    try:
        plan_with_offload(graph, budget, remat, time_limit_s=0.0)
    except solvers.InfeasibleBudget:
        pass
    assert shares == []


@search(25, derandomize=True)
@given(graph=training_graphs(), share=st.floats(0.3, 0.95), bandwidth=st.sampled_from([10.0, 1e3, 1e6]))
def test_refining_the_ladder_never_plans_slower(graph, share, bandwidth):
    link = graph.proto.provenance.host_link
    link.bandwidth_bytes_per_s, link.latency_s, link.overlapped = bandwidth, 1e-3, True
    budget = max(1, int(share * ir.store_all(graph).predicted_peak_bytes))
    planned = {}
    for levels in (0, REFINE_LEVELS):
        try:
            planned[levels] = ir.check(graph, plan_with_offload(
                graph, budget, lambda b: solvers.solve(graph, b, "rotor"), refine_levels=levels))
        except solvers.InfeasibleBudget:
            planned[levels] = None
    if planned[0] is not None:
        assert planned[REFINE_LEVELS] is not None
        assert planned[REFINE_LEVELS].total_time_s <= planned[0].total_time_s
    for result in planned.values():
        assert result is None or result.peak_bytes <= budget


@pytest.mark.parametrize("name", ["gpt2", "cnn_batchnorm"])
def test_the_calibration_step_with_round_trips_trains_like_eager(name):
    """The step `transfer_calibration` times beside store-everything: its largest saved
    values offloaded once computed and prefetched at the backward's start. A valid
    schedule with two transfers per value, run bitwise like eager (on CPU a copy)."""
    graph = lowered(name)
    trips = round_trip_schedule(graph)
    assert trips is not None and ir.simulate(graph, trips).valid
    offloaded = [s.offload for s in trips.steps if s.HasField("offload")]
    prefetched = [s.prefetch for s in trips.steps[trips.backward_start:] if s.HasField("prefetch")]
    assert 0 < len(offloaded) <= ROUND_TRIPS and sorted(offloaded) == sorted(prefetched)
    saved = ir.simulate(graph, store_all(graph)).saved_value_ids
    assert set(offloaded) <= set(saved)
    model, args, kwargs, loss_of = zoo_models.ZOO[name]()
    errors = side_by_side(model, lambda m: ScheduledModule(m, graph, trips), args, kwargs, loss_of, steps=2)
    assert errors == {}, errors


def test_the_host_time_per_transfer_is_what_the_step_measured_beyond_the_simulator():
    """`fit_issue_seconds` on rounds whose difference is the simulated one plus 40 us per
    transfer finds 40 us, whatever the link's own `issue_s` says; a difference below the
    simulated one gives 0, never a negative time."""
    graph = own_copy("gpt2")
    describe_link(graph, "25GB/s")
    graph.proto.provenance.host_link.issue_s = 1e-3
    trips, store = round_trip_schedule(graph), store_all(graph)
    transfers = sum(s.HasField("offload") or s.HasField("prefetch") for s in trips.steps)
    graph.proto.provenance.host_link.issue_s = 0.0
    simulated = ir.simulate(graph, trips).total_time_s - ir.simulate(graph, store).total_time_s
    graph.proto.provenance.host_link.issue_s = 1e-3
    store_rounds = [0.010, 0.012, 0.011, 0.013, 0.010]
    trips_rounds = [s + simulated + transfers * 40e-6 for s in store_rounds]
    assert fit_issue_seconds(graph, store, store_rounds, trips, trips_rounds) == pytest.approx(40e-6)
    assert graph.proto.provenance.host_link.issue_s == 1e-3   # left as it was
    assert fit_issue_seconds(graph, store, store_rounds, trips, store_rounds) == 0.0
    assert fit_issue_seconds(graph, store, store_rounds[:1], trips, trips_rounds[:1]) is None


def test_the_transfer_calibration_runs_on_a_step():
    """End to end on the CPU (where `add_costs` does not use it: a CPU's copies are the
    compute timeline's own): the two steps run on the model's tensors and give a time;
    where they cannot run, no time (the lowering keeps the isolated measure)."""
    model, args, kwargs, loss_of = zoo_models.ZOO["gpt2"]()
    graph = own_copy("gpt2")
    fitted = calibrate_issue_seconds(graph, resident_values(model, graph, args, kwargs), "cpu")
    assert fitted is not None and fitted >= 0.0
    # Steps that cannot run (here: no tensors to run them on) leave the isolated measure.
    assert calibrate_issue_seconds(graph, {}, "cpu") is None
