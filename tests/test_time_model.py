"""The time model: ops timed inside whole steps ("profile"), the step's overhead, and
memory that never depends on timing."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from remat_ir import ir
from remat_ir.ir import pb
from remat_ir.lowering import lower_torch
from remat_ir.runtimes.timing import time_schedule
from remat_ir.runtimes.torch import ScheduledModule, resident_values
from torch_models import conv_bn, gpt2, mlp
from strategies import search


def _memory(graph: ir.Graph) -> tuple:
    """Every byte the memory model reads: storage sizes and workspaces."""
    return (tuple((s.id, s.size_bytes) for s in graph.proto.storages),
            tuple((n.id, n.cost.workspace_bytes) for n in graph.proto.nodes))


@pytest.fixture(scope="module")
def small_gpt2():
    model, args, kwargs, loss_of = gpt2()
    model.train()
    return model, args, kwargs, loss_of, lower_torch(model, args, example_kwargs=kwargs)


def test_profile_times_every_op_inside_the_step_and_records_how(small_gpt2):
    model, args, kwargs, _, graph = small_gpt2
    record = graph.proto.provenance.cost_model
    assert (record.name, record.timed_schedule, record.note) == ("profile", "store_all", ""), record
    assert record.timed_steps >= 2 and record.step_overhead_s > 0 and record.call_overhead_s > 0
    assert record.calibration_schedule == "sqrt" and record.peak_byte_s >= 0
    # No schedule is left in the file with a time priced on the isolated costs the
    # calibration replaced (its sqrt schedule was: `remat-ir validate` called it INCONSISTENT).
    from remat_ir.reports import prediction_mismatches
    assert not [m for s in graph.schedules for m in prediction_mismatches(s, ir.check(graph, s))]
    assert all(n.cost.source == pb.TIMED_IN_STEP and n.cost.time_s >= 0 for n in graph.proto.nodes)
    # The simulator prices a schedule with the overhead included, once per step.
    from remat_ir.reports import inspect_lines
    assert "cost model 'profile' (ops timed inside" in "\n".join(inspect_lines(graph, "gpt2.rir"))
    assert "per call in the runtime outside its segments" in "\n".join(inspect_lines(graph, "gpt2.rir"))
    store = ir.simulate(graph, ir.store_all(graph))
    assert store.overhead_time_s == record.step_overhead_s + record.call_overhead_s
    assert store.footprint_time_s == record.peak_byte_s * store.peak_bytes
    assert store.total_time_s == pytest.approx(
        sum(n.cost.time_s for n in graph.proto.nodes) + record.step_overhead_s + record.call_overhead_s
        + store.footprint_time_s)


def test_memory_is_the_same_whatever_the_timing(small_gpt2):
    """Timing noise never reaches the bytes: lowering again, or with isolated times,
    gives the same storages and workspaces (and so the same simulated peaks)."""
    model, args, kwargs, _, graph = small_gpt2
    again = lower_torch(model, args, example_kwargs=kwargs)
    isolated = lower_torch(model, args, example_kwargs=kwargs, cost_model="isolated")
    assert _memory(graph) == _memory(again) == _memory(isolated)
    assert isolated.proto.provenance.cost_model.name == "isolated"
    assert {n.cost.source for n in isolated.proto.nodes} <= {pb.PROFILED, pb.ANALYTIC}


def test_time_schedule_times_each_compute_step_and_leaves_the_model_and_generator_alone(small_gpt2):
    model, args, kwargs, _, graph = small_gpt2
    schedule = ir.recompute_all(graph)  # random nodes recomputed with RNG replay
    parameters = {k: v.detach().clone() for k, v in model.state_dict().items()}
    state = torch.get_rng_state()
    timing = time_schedule(graph, schedule, resident_values(model, graph, args, kwargs), "cpu", steps=2)
    computed = ir.compute_sequence(schedule)
    assert [n for n, _ in timing.occurrences] == computed
    assert len(computed) > len(set(computed))  # recomputations are timed one by one
    assert all(seconds >= 0 for _, seconds in timing.occurrences)
    assert timing.steps == 2 and timing.step_s >= sum(s for _, s in timing.occurrences)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(parameters[k], v) for k, v in model.state_dict().items())


def test_the_calls_time_outside_its_segments_is_measured_in_real_calls_that_leave_no_trace():
    """`call_overhead_s` comes from real training calls of the store-everything schedule:
    the model's `.grad`, its buffers (BatchNorm's running statistics and batch count,
    which a training call updates) and the generator are as the caller left them."""
    from remat_ir.lowering import add_costs
    from remat_ir.runtimes.call_overhead import measure_call_overhead

    model, args, kwargs, loss_of = conv_bn(blocks=2)
    model.train()
    graph = lower_torch(model, args, cost_model=None)
    loss_of(model(*args)).backward()          # a gradient the caller accumulates into
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    grad_objects = [p.grad for p in model.parameters()]
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    torch.manual_seed(11)
    state = torch.get_rng_state()
    add_costs(graph, "profile", model=model, example=(args, kwargs))
    record = graph.proto.provenance.cost_model
    assert record.call_overhead_s > 0 and "not measured" not in record.note, record
    assert torch.equal(torch.get_rng_state(), state)
    assert [p.grad for p in model.parameters()] == grad_objects
    assert all(torch.equal(p.grad, grads[n]) for n, p in model.named_parameters())
    assert all(torch.equal(b, buffers[n]) for n, b in model.named_buffers())
    assert sum(n.endswith("num_batches_tracked") for n in buffers) > 0
    # Where a call would not leave the model alone, or does not train, nothing is measured.
    hook = next(model.parameters()).register_hook(lambda g: g)
    assert measure_call_overhead(graph, model, args, kwargs, "cpu") == (None, "a parameter holds a hook")
    hook.remove()
    model.eval()
    assert measure_call_overhead(graph, model, args, kwargs, "cpu") == (None, "the model is in eval mode")
    unmeasured = lower_torch(model, args, cost_model=None)
    add_costs(unmeasured, "profile", model=model, example=(args, kwargs))
    assert unmeasured.proto.provenance.cost_model.call_overhead_s == 0
    assert "the runtime's time per call was not measured" in unmeasured.proto.provenance.cost_model.note


def test_the_calls_time_is_measured_on_the_runner_that_runs_and_leaves_inputs_and_buffers_alone():
    """The device named otherwise than the inputs' (`cpu:0`) still clocks the segments the
    calls run (the whole step was counted as overhead before: 0.40 s against 1.1 ms); an
    input requiring a gradient gets none from the calls; a buffer no call writes keeps its
    version (put back by `copy_`, a pending step reading it was refused as written)."""
    from remat_ir.runtimes.call_overhead import measure_call_overhead

    class WithInputGradAndMask(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(32, 32)
            self.register_buffer("mask", torch.ones(32))

        def forward(self, x):
            return (torch.tanh(self.a(x)) * self.mask).square().mean()

    torch.manual_seed(0)
    model = WithInputGradAndMask()
    x = torch.randn(64, 32, requires_grad=True)
    graph = lower_torch(model, (x,), cost_model=None)
    version = model.mask._version
    timed = {}
    for device in ("cpu", "cpu:0"):
        timed[device], why = measure_call_overhead(graph, model, (x,), {}, device)
        assert timed[device] is not None and why == ""
    assert timed["cpu:0"] < 100 * max(timed["cpu"], 1e-4)   # not the whole step
    assert x.grad is None and model.mask._version == version


def test_the_segment_clock_counts_every_segment_and_changes_no_result():
    """The clock `call_overhead` puts on a runner's segments adds the time of the forward
    segment and of each resumption of the backward segment, and the step computes what it
    computes without it: bitwise the same loss and gradients."""
    from remat_ir.runtimes.call_overhead import _time_segments

    model, args, kwargs, loss_of = mlp()
    graph = lower_torch(model, args, cost_model=None)
    plain = ScheduledModule(copy.deepcopy(model), graph, ir.store_all(graph))
    clocked = ScheduledModule(model, graph, ir.store_all(graph))
    inside = [0.0]
    _time_segments(clocked.runner(torch.device("cpu")), inside)
    results = []
    for module in (plain, clocked):
        torch.manual_seed(5)   # the same dropout masks
        loss = loss_of(module(*args))
        before = inside[0]
        loss.backward()
        results.append((loss.detach(), [p.grad for p in module.parameters()], before, inside[0]))
    (loss, grads, _, _), (clocked_loss, clocked_grads, forward_s, total_s) = results
    assert torch.equal(loss, clocked_loss) and all(map(torch.equal, grads, clocked_grads))
    assert 0 < forward_s < total_s


def test_without_model_tensors_profile_keeps_isolated_times_and_says_so():
    from remat_ir.lowering import add_costs

    model, args, _, _ = mlp()
    graph = lower_torch(model, args, cost_model=None)
    add_costs(graph, "profile")
    record = graph.proto.provenance.cost_model
    assert record.name == "profile" and "no model tensors" in record.note
    assert record.step_overhead_s == 0 and not record.timed_schedule
    assert all(n.cost.source == pb.PROFILED for n in graph.proto.nodes)


def test_training_through_a_profiled_plan_is_still_exact(small_gpt2):
    """In-step timing runs the model's own tensors: training afterwards draws the same
    dropout masks and gives eager's gradients bitwise."""
    model, args, kwargs, loss_of, graph = small_gpt2
    eager = copy.deepcopy(model)
    scheduled = ScheduledModule(model, graph, ir.recompute_all(graph))
    torch.manual_seed(3)
    loss_of(eager(*args, **kwargs)).backward()
    torch.manual_seed(3)
    loss_of(scheduled(*args, **kwargs)).backward()
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):
        assert torch.equal(p.grad, q.grad), name


def test_a_parameter_replaced_after_planning_is_the_one_trained():
    """The runtime looks parameters up at every call (through the modules' dictionaries,
    not once for all): a parameter or submodule replaced since lowering is used."""
    model, args, _, _ = mlp()
    graph = lower_torch(model, args, cost_model=None)
    scheduled = ScheduledModule(model, graph, ir.store_all(graph))
    first = next(name for name, _ in model.named_parameters())
    path, _, leaf = first.rpartition(".")
    owner = model.get_submodule(path)
    replacement = torch.nn.Parameter(getattr(owner, leaf).detach() * 2)
    setattr(owner, leaf, replacement)
    expected = copy.deepcopy(model)
    torch.manual_seed(1)
    scheduled(*args).backward()
    torch.manual_seed(1)
    expected(*args).backward()
    assert replacement.grad is not None
    assert torch.equal(replacement.grad, expected.get_parameter(first).grad)


# ----------------------------------------------------------------- the footprint fit

@pytest.fixture(scope="module")
def graph_and_schedules():
    from remat_ir import solvers
    from builders import chain

    graph, _ = chain(12)
    store, low = ir.store_all(graph), solvers.solve(graph, None, "sqrt")
    assert ir.simulate(graph, low).peak_bytes < 0.8 * ir.simulate(graph, store).peak_bytes
    return graph, store, low


def _timing(graph, schedule, seconds: dict, overhead: float):
    from remat_ir.runtimes.timing import ScheduleTiming

    computed = ir.compute_sequence(schedule)
    return ScheduleTiming([(n, seconds[n]) for n in computed], overhead, 0.0, 5)


@search(40)
@given(peak_byte_s=st.floats(1e-12, 1e-8), overhead=st.floats(0.0, 1e-3),
       seconds=st.lists(st.floats(1e-6, 1e-2), min_size=64, max_size=64))
def test_the_footprint_fit_recovers_the_price_that_made_the_timings(graph_and_schedules, peak_byte_s,
                                                                     overhead, seconds):
    """Timings made by the model itself (net op times c(n), a price per byte of peak) are
    what the fit must invert: it returns that price and those net times."""
    from remat_ir.runtimes.calibration import fit_peak_byte_cost, high_water_increments

    graph, store, low = graph_and_schedules
    net = {node.id: seconds[i % len(seconds)] for i, node in enumerate(graph.proto.nodes)}
    computed = ir.compute_sequence(store)
    raised = dict(zip(computed, high_water_increments(store, ir.simulate(graph, store))))
    in_store = {n: net[n] + peak_byte_s * raised[n] for n in net}
    low_peak = ir.simulate(graph, low).peak_bytes
    fitted = fit_peak_byte_cost(graph, store, _timing(graph, store, in_store, overhead),
                                low, _timing(graph, low, net, overhead + peak_byte_s * low_peak))
    assert fitted is not None
    price, costs = fitted
    assert price == pytest.approx(peak_byte_s, rel=1e-6)
    assert all(costs[n] == pytest.approx(net[n], rel=1e-6, abs=1e-12) for n in net)


def test_the_footprint_price_is_the_least_the_timed_rounds_demand(graph_and_schedules):
    """With timed rounds, the fit aims at the top of the measured ratio's interval: rounds
    that agree (drift of the machine hitting both schedules alike) give the price that
    made the timings; rounds that scatter give less, and none once the op times alone
    predict the low-memory step within the scatter."""
    import numpy as np

    from remat_ir.runtimes.calibration import fit_peak_byte_cost, high_water_increments

    graph, store, low = graph_and_schedules
    net = {node.id: 1e-3 * (1 + i % 5) for i, node in enumerate(graph.proto.nodes)}
    computed = ir.compute_sequence(store)
    raised = dict(zip(computed, high_water_increments(store, ir.simulate(graph, store))))
    price = 0.5 * min(net.values()) / max(raised.values())  # no net cost clamped at 0
    in_store = {n: net[n] + price * raised[n] for n in net}
    store_timing = _timing(graph, store, in_store, 0.0)
    low_timing = _timing(graph, low, net, price * ir.simulate(graph, low).peak_bytes)
    drift = np.random.default_rng(0).uniform(0.8, 1.3, size=10)

    def fitted(scatter: float) -> float:
        noise = np.random.default_rng(1).uniform(1 - scatter, 1 + scatter, size=10)
        store_timing.round_s = list(store_timing.robust_step_s * drift)
        low_timing.round_s = list(low_timing.robust_step_s * drift * noise)
        return fit_peak_byte_cost(graph, store, store_timing, low, low_timing)[0]

    raw_excess = (sum(in_store[n] for n in ir.compute_sequence(low)) / sum(in_store[n] for n in computed)
                  / (low_timing.robust_step_s / store_timing.robust_step_s) - 1)
    assert 0.005 < raw_excess < 0.5  # the footprint made the low-memory step measurably faster
    assert fitted(0.0) == pytest.approx(price, rel=1e-6)
    assert 0 < fitted(raw_excess / 4) < price
    assert fitted(3 * raw_excess) == 0.0


def test_a_low_memory_step_no_faster_than_predicted_gives_no_footprint_price(graph_and_schedules):
    from remat_ir.runtimes.calibration import fit_peak_byte_cost

    graph, store, low = graph_and_schedules
    seconds = {node.id: 1e-3 for node in graph.proto.nodes}
    slower = _timing(graph, low, {n: 2e-3 for n in seconds}, 0.0)
    price, costs = fit_peak_byte_cost(graph, store, _timing(graph, store, seconds, 0.0), low, slower)
    assert price == 0.0 and costs == seconds


def test_remat_reports_profiling_progress():
    """Timing whole steps takes a while on a big model: `progress` hears each round."""
    import remat_ir

    model, args, _, _ = mlp()
    messages: list[str] = []
    remat_ir.remat(model, args, progress=messages.append, cache_dir=False)
    assert any(m.startswith("profiling: ") and "distinct ops timed alone" in m for m in messages)
    rounds = [m for m in messages if m.startswith("timing store_all and sqrt op by op: round ")]
    assert rounds and rounds[0].endswith("round 1 of at most 10"), messages


def test_pricing_for_a_device_keeps_memory_and_names_unknown_devices():
    """`priced_for` (how benchmarks plan for a GPU that is not there) re-prices every node
    from its recorded FLOPs and bytes, leaves memory alone, and refuses a device type it
    has no rates for in one line instead of pricing it at CPU rates."""
    from remat_ir.ir.examples import mlp as mlp_graph
    from remat_ir.runtimes.profiling import RATES, analytic_seconds, priced_for

    graph = mlp_graph()
    peak = ir.store_all(graph).predicted_peak_bytes
    priced = priced_for(graph, "cuda")
    assert all(n.cost.time_s == analytic_seconds(n.cost.flops, n.cost.bytes_accessed, "cuda")
               for n in priced.proto.nodes)
    assert ir.store_all(priced).predicted_peak_bytes == peak
    assert "gpu" not in RATES
    with pytest.raises(ValueError, match="no FLOP-model rates for device type 'gpu'; known: cpu, cuda"):
        priced_for(graph, "gpu")


class _MixedOperands(torch.nn.Module):
    """`op(weight, other)` with `other` of any dtype and a broadcastable shape; the
    dropout variant's backward reads the loss's gradient expanded (stride 0)."""

    def __init__(self, op):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(64, 32))
        self.op = op

    def forward(self, other):
        if self.op == "dropout":
            return torch.nn.functional.dropout(self.weight * other, 0.5).sum()
        y = getattr(torch, self.op)(self.weight, other)
        return (y if y.dtype.is_floating_point else y.float()).sum() + self.weight.square().sum()


@search(10)
@given(op=st.sampled_from(["mul", "add", "sub", "gt", "maximum", "dropout"]),
       dtype=st.sampled_from([torch.bool, torch.float64, torch.bfloat16, torch.int64, torch.float32]),
       shape=st.sampled_from([(64, 32), (32,), (1, 32), (64, 1)]))
@example(op="dropout", dtype=torch.float32, shape=(64, 32))  # an expanded gradient, always
@example(op="mul", dtype=torch.bool, shape=(32,))           # a broadcast mask, always
def test_flops_costs_count_the_casts_cpu_kernels_make(op, dtype, shape):
    """On CPU a pointwise op casts operands of another dtype than the common one into
    temporaries first (`x * mask` allocates the mask as floats): the "flops" model, which
    runs nothing, records that workspace as the isolated runs measure it, and every
    node is measured in those runs (expanded inputs included)."""
    from remat_ir.runtimes.profiling import CASTING_OPERANDS, cast_workspace
    from remat_ir.torchlib.types import resolve_op

    if dtype == torch.bool and op in ("sub", "dropout"):
        dtype = torch.float64  # `-` refuses booleans; dropout's mask is the split's
    other = (torch.rand(shape) > 0.5) if dtype == torch.bool else (torch.randn(shape) * 4).to(dtype)
    model = _MixedOperands(op)
    measured = lower_torch(model, (other,), cost_model="isolated")
    estimated = lower_torch(model, (other,), cost_model="flops")
    assert all(n.cost.source == pb.PROFILED for n in measured.proto.nodes)
    casting = 0
    for a, b in zip(measured.proto.nodes, estimated.proto.nodes, strict=True):
        assert a.op == b.op
        arguments = resolve_op(a.op)._schema.arguments
        if len(arguments) > 1 and (arguments[0].name, arguments[1].name) in CASTING_OPERANDS:
            assert b.cost.workspace_bytes == cast_workspace(estimated, b, "cpu")
            # A wrapped scalar operand is cast too: a few bytes the model leaves out.
            assert 0 <= a.cost.workspace_bytes - b.cost.workspace_bytes <= 16, measured.describe_node(a.id)
            casting += b.cost.workspace_bytes > 0
    assert casting or dtype == torch.float32


def test_the_arguments_profiling_makes_on_the_host_are_this_torchs():
    """`profiling.HOST_ARGUMENTS` names ops and arguments of this torch: a rename would
    leave the memory-efficient attention's random state on the GPU when profiling on CUDA,
    where its backward dereferences it on the host (a segmentation fault on an H100)."""
    from remat_ir.runtimes.profiling import HOST_ARGUMENTS
    from remat_ir.torchlib.types import resolve_op

    for name, arguments in HOST_ARGUMENTS.items():
        schema = {a.name: str(a.type) for a in resolve_op(name)._schema.arguments}
        assert all(schema.get(a) == "Tensor" for a in arguments), (name, schema)


def test_the_segments_timed_in_a_call_include_a_backward_that_leaves_outputs_out():
    """The overhead's calls leave a model's logits out of the backward, which then runs a
    backward generated for that (`runtimes/absent_gradients.py`): it is timed as the
    segment too, or its whole time would count as the call's overhead."""
    from remat_ir.ir import store_all
    from remat_ir.runtimes.call_overhead import _time_segments
    from remat_ir.runtimes.torch import ScheduledModule

    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(16, 16)

        def forward(self, x):
            h = self.linear(x)
            return h, (h * h).mean()

    torch.manual_seed(0)
    model, x = TwoHeads(), torch.randn(8, 16)
    graph = lower_torch(model, (x,), cost_model="flops")
    scheduled = ScheduledModule(model, graph, store_all(graph))
    scheduled(x)[1].backward()
    inside = [0.0]
    _time_segments(scheduled.runner(torch.device("cpu")), inside)
    loss = scheduled(x)[1]
    after_forward = inside[0]
    assert after_forward > 0
    loss.backward()
    assert inside[0] > after_forward
