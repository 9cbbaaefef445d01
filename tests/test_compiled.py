"""The Inductor backend (`backend="inductor"`, `runtimes/compiled.py`).

Runs of plain steps become regions compiled by Inductor; what the schedule decided
must survive: every compute step runs exactly once where the schedule puts it
(recomputations included), random nodes stay outside regions and draw eager's
numbers, and the step stays within its budget. Compiled kernels round differently
from eager ones, so gradients are compared within 1e-5 of the model's largest
gradient (`exactness.side_by_side(model_scale=True)`); with the regions run op by op
instead of compiled, random schedules must stay bitwise equal to eager.
"""

from __future__ import annotations

import random
import re

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import remat_ir
from remat_ir.api import plan
from remat_ir.ir import simulate
from remat_ir.ir.fusion import body_nodes
from remat_ir.ir.memory import allocated_bytes, is_view
from remat_ir.lowering import lower_torch
from remat_ir.runtimes import compiled
from remat_ir.runtimes.memory import measure_peak
from remat_ir.runtimes.torch import ScheduledModule
from remat_ir.solvers import InfeasibleBudget

import zoo_models
from exactness import (DEVICES, SCHEDULE_DRAWS, SEARCH_MODELS, copy_model, lowered, random_schedule,
                       relative_error, side_by_side)
from slow import some_slow
from random_networks import RandomNet, programs
from strategies import search

#: Random nodes (dropout), buffer updates (BatchNorm), a preserved custom Function.
MODELS = ("gpt2", "cnn_batchnorm", "straight_through")


def _plan_at_half(graph):
    try:
        return plan(graph, "50%", time_limit_s=5)
    except InfeasibleBudget as exc:
        return exc.schedule or plan(graph, exc.smallest_feasible, time_limit_s=5)


#: One transformer block where two would only compile the same kinds of regions again
#: (each region is an Inductor compile of about 1.6 s on a CPU: 51 for two blocks).
ONE_BLOCK = {"gpt2": {"layers": 1}}

# On a CUDA machine (`make gpu-tests`) Inductor's Triton kernels are checked too (DEVICES).
#: Known on CUDA (H100, torch 2.11): gradients within 1e-5, but the compiled step's peak
#: above the plan's on this tiny graph: straight_through 5,632 bytes against 5,120 (one
#: 512-byte block, as the loss's gradient seed was, uncounted until
#: `ir.memory.gradient_seed_bytes`: not measured on a GPU since). GPT-2 (233,984 against
#: 190,464 on 2026-11-26) and cnn_batchnorm measured within 5% on 2026-11-28.
#: Model -> the most over its plan the test lets it be there (what the H100 measured).
CUDA_PEAK_GAP = {"straight_through": 1.10}


def _known_gap(name: str, device: str) -> float:
    """How far over its plan the peak may be and xfail rather than fail (0: not at all);
    only the peak check gives way, after the gradients and regions passed."""
    return CUDA_PEAK_GAP.get(name, 0.0) if device == "cuda" else 0.0


def eager_lines(source: str) -> int:
    """How many compute steps the generated `source` runs as eager lines: a call of an op
    (`op_*`, a backward `_view_or_reshape`) or of `_replay`, or a detach (the value itself).
    A step whose buffer is reused is written twice, `out=` form and functional fallback
    (`op_*_f`) in the two branches of an `if`: one step."""
    calls = re.findall(r"^\s*(?:v\d+|_r) = (?:op_\w+|_replay|_view_or_reshape)\(", source, re.MULTILINE)
    detaches = re.findall(r"^\s*v\d+ = v\d+$", source, re.MULTILINE)
    fallbacks = re.findall(r"^\s*else:\n\s*v\d+ = op_\w+_f\(", source, re.MULTILINE)
    return len(calls) + len(detaches) - len(fallbacks)


@pytest.mark.parametrize("device", DEVICES)
#: GPT-2 compiled by Inductor stays in `make test` through the fused kernels' random schedule.
@pytest.mark.parametrize("name", some_slow(MODELS, ["gpt2"]))
def test_inductor_backend_trains_like_eager_within_5_percent_of_its_plan(name, device):
    """Gradients within 1e-5 of eager's, every compute step run once (in a region or as an
    eager line), no random node compiled, and the compiled step's measured peak within 5%
    of the plan's (one test: lowering on profiled costs and compiling is most of its time)."""
    model, args, kwargs, loss_of = zoo_models.ZOO[name]("tiny", **ONE_BLOCK.get(name, {}))
    model, args = model.to(device), tuple(a.to(device) for a in args)
    kwargs = {k: v.to(device) for k, v in kwargs.items()}
    graph = lower_torch(model, args, example_kwargs=kwargs, cost_model="profile", backend="inductor")
    schedule = _plan_at_half(graph)
    made = []

    def make(m):
        made.append(ScheduledModule(m, graph, schedule, backend="inductor"))
        return made[-1]

    side_by_side(model, make, args, kwargs, loss_of, tolerance=1e-5, model_scale=True)

    scheduled = made[0]
    runner = scheduled.runner(next(model.parameters()).device)
    regions = runner.plan.regions
    assert regions, "nothing was compiled"
    # Every compute step runs once (a fused node: each of its members), in a region or as an
    # eager line: no step merged away.
    in_regions = sum(len(body_nodes(graph.node(n))) for r in regions for n in r.node_ids)
    source = runner.plan.forward_source + runner.plan.backward_source
    eager_steps = eager_lines(source)
    computes = sum(len(body_nodes(graph.node(s.compute))) for s in schedule.steps if s.HasField("compute"))
    assert in_regions + eager_steps == computes
    assert not any(graph.node(n).random for r in regions for n in r.node_ids)
    ops = [n for r in regions for n in r.module.graph.nodes
           if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]
    assert len(ops) == in_regions

    for _ in range(2):  # compiled already: the second step is measured after a settling one
        scheduled.zero_grad(set_to_none=True)
        peak = measure_peak(lambda: loss_of(scheduled(*args, **kwargs)).backward(), device).peak_bytes
    predicted = simulate(graph, schedule).peak_bytes
    if 1.05 * predicted < peak <= _known_gap(name, device) * predicted:
        pytest.xfail(f"known CUDA peak gap: measured {peak} bytes, planned {predicted}")
    assert peak <= 1.05 * predicted, f"measured {peak} bytes, planned {predicted}"


class _SequenceBatchNorm(torch.nn.Module):
    """BatchNorm1d over the features of a (B, T, C) sequence, through transposes, then
    random draws into the normalized activation's layout."""

    def __init__(self):
        super().__init__()
        self.inp, self.bn, self.out = torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 8)

    def forward(self, x):
        h = torch.relu(self.bn(self.inp(x).transpose(1, 2)).transpose(1, 2))
        h = torch.nn.functional.dropout(h, 0.3, self.training) * torch.rand_like(h)
        return self.out(h + torch.randn_like(h)).square().mean()


def test_draws_after_a_batchnorm_over_a_transposed_sequence_land_where_eagers_do():
    """Eager's CPU BatchNorm kernel makes its result contiguous; the decomposed BatchNorm the
    inductor backend runs kept the transposed input's layout, and the dropout's mask,
    `rand_like` and `randn_like`, which draw in memory order, put eager's numbers in other
    positions: outputs 1.5 off, gradients up to 29% of the largest, the generator state
    still eager's (found by a review). The decomposition now lays its result out as the
    kernel does. Two steps with dropout recomputed in the backward (recompute-all)."""
    torch.manual_seed(0)
    model, x = _SequenceBatchNorm(), torch.randn(4, 24, 16)
    for solver in ("autograd", "recompute-all"):
        side_by_side(model, lambda m: remat_ir.remat(m, (x,), solver=solver, cost_model="flops",
                                                     backend="inductor"),
                     (x,), {}, lambda loss: loss, tolerance=1e-5, model_scale=True)


class _ShuffledChannelsLast(torch.nn.Module):
    """Ops whose CPU kernel and Inductor's trace lay out a channels-last input's result
    differently: `channel_shuffle` (channels-last kernel, contiguous trace) before a
    dropout, and `index_select` (contiguous kernel, channels-last trace) as the output."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        h = torch.relu(self.conv(x.contiguous(memory_format=torch.channels_last)))
        h = torch.nn.functional.dropout(torch.nn.functional.channel_shuffle(h, 2), 0.5, self.training)
        return torch.index_select(torch.tanh(h), 1, torch.tensor([0, 2, 4, 6]))


def test_region_outputs_keep_the_layouts_eagers_kernels_give():
    """A compiled region returned its outputs in Inductor's layout, not the kernel's the
    graph records: the dropout after a channels-last `channel_shuffle` drew eager's mask
    into other positions (outputs 1.41 off, gradients 0.47 of the largest), and the model
    returned `index_select` channels-last where eager returns it contiguous, so a loss
    drawing `rand_like` of it put its noise elsewhere (gradients 0.57 relative); the eager
    backend is bitwise (found by a review). Regions now return the recorded strides
    (`compiled.in_recorded_layouts`), on a plan at half the memory (the convolution and
    ReLU recomputed in the backward, in a region too), holding no more than the eager backend
    on that plan (measured: 22,592 bytes compiled, as before the fix, against 23,560; the
    tiny graph's plan, 15,396, counts neither the loss nor small tensors made per call)."""
    torch.manual_seed(0)
    model, x = _ShuffledChannelsLast(), torch.randn(2, 3, 8, 8)
    graph = lower_torch(model, (x,), cost_model="flops", backend="inductor")
    schedule = _plan_at_half(graph)
    made = []

    def make(m):
        made.append(ScheduledModule(m, graph, schedule, backend="inductor"))
        return made[0]

    def loss_of(out):
        return (out * torch.rand_like(out)).sum()

    side_by_side(model, make, (x,), {}, loss_of, tolerance=1e-5, model_scale=True)
    scheduled = made[0]
    assert scheduled.runner(x.device).plan.regions, "nothing was compiled"
    with torch.no_grad():
        assert scheduled(x).stride() == model(x).stride() == (256, 64, 8, 1)
    peaks = []
    for module in (scheduled, ScheduledModule(model, graph, schedule)):
        for _ in range(2):  # the second step is measured, after a settling one
            module.zero_grad(set_to_none=True)
            peak = measure_peak(lambda: loss_of(module(x)).backward(), x.device).peak_bytes
        peaks.append(peak)
    assert peaks[0] <= 1.05 * peaks[1], f"compiled {peaks[0]} bytes, eager backend {peaks[1]}"


def test_inductor_backend_matches_torch_compile():
    """Gradients of the compiled segments equal those of `torch.compile(model)` (dropout
    off: Inductor's own random numbers are not eager's)."""
    model, args, kwargs, loss_of = zoo_models.ZOO["cnn_batchnorm"]("tiny")
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    reference = torch.compile(copy_model(model))
    scheduled = remat_ir.remat(model, args, "70%", cost_model="flops", time_limit_s=5,
                               backend="inductor")
    loss_of(reference(*args, **kwargs)).backward()
    loss_of(scheduled(*args, **kwargs)).backward()
    largest = max(p.grad.abs().max().item() for p in reference.parameters())
    for (name, a), b in zip(reference.named_parameters(), scheduled.parameters()):
        error = (a.grad - b.grad).abs().max().item() / largest
        assert error <= 1e-5, f"{name}: {error:.3g}"


class _TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.head, self.aux = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8), torch.nn.Linear(16, 4)

    def forward(self, x):
        h = torch.tanh(self.body(x))
        return self.head(h), self.aux(h)


def test_steps_whose_losses_read_other_outputs_run_compiled():
    """Steps whose losses read both outputs, one or the other (alternating losses): an
    output the loss does not read gets a broadcast zero as its gradient, and a region
    compiled for the traced layout failed in Inductor's stride assertions (found by a
    review: `expected size 4==4, stride 0==512`). Gradients match eager's at each step."""
    torch.manual_seed(0)
    model, x = _TwoHeads(), torch.randn(4, 8, 8)
    eager = copy_model(model)
    scheduled = remat_ir.remat(model, (x,), None, cost_model="flops", backend="inductor")
    losses = [lambda y, z: y.square().mean() + z.mean(), lambda y, z: y.square().mean(),
              lambda y, z: z.mean(), lambda y, z: y.square().mean() + z.mean()]
    for loss_of in losses:
        for m in (eager, scheduled):
            m.zero_grad(set_to_none=True)
            loss_of(*m(x)).backward()
        largest = max(p.grad.abs().max().item() for p in eager.parameters() if p.grad is not None)
        for (name, a), b in zip(eager.named_parameters(), model.parameters()):
            assert (a.grad is None) == (b.grad is None), name
            if a.grad is not None:
                assert (a.grad - b.grad).abs().max().item() <= 1e-5 * largest, name


SETTINGS = search(8, derandomize=True)


@pytest.mark.parametrize("name", SEARCH_MODELS)
@SETTINGS
@given(**SCHEDULE_DRAWS)
# Soak, lora_llama: a view computed, freed and computed again in one run, its first copy
# run before the region (`_escaping_views`) and its second in it (the region's steps were
# a range then, which the check matched to the first).
@example(seed=8876343, recompute=0.3, defer=0.0, groups=1)
def test_regions_of_random_schedules_run_op_by_op_are_exact(monkeypatch, name, seed, recompute, defer,
                                                            groups):
    """How segments are cut into regions (inputs, values freed inside, recomputations in
    one region, outputs) is checked bitwise: the regions' graphs run op by op."""
    monkeypatch.setattr(compiled.Region, "_compile", lambda region, tensors: region.eager)
    # Fused nodes as the inductor backend plans with them, on eager's ops (its graph also
    # decomposes BatchNorm, whose bits differ from eager's kernel: checked within 1e-5 above).
    graph = compiled.fuse_for_inductor(lowered(name))
    schedule = random_schedule(graph, random.Random(seed), recompute_share=recompute, defer_share=defer)
    model, args, kwargs, loss_of = zoo_models.ZOO[name]()
    made = []

    def make(m):
        made.append(ScheduledModule(m, graph, schedule, gradient_groups=groups, backend="inductor"))
        return made[-1]

    # Without a contribution from outside the module: the inductor backend hands each
    # gradient over whole (its sums run in regions), which is eager's only without one.
    errors = side_by_side(model, make, args, kwargs, loss_of, steps=2, outside=False)
    assert errors == {}, f"not bitwise equal to eager: {errors}"
    for region in made[0].runner(torch.device("cpu")).plan.regions:
        _assert_room_for_fusion(graph, schedule, region)
        assert not any(graph.node(n).op in compiled.EAGER_OPS for n in region.node_ids)


@search(10, derandomize=True)
@given(program=programs(), seed=st.integers(0, 2**32 - 1), recompute=st.sampled_from([0.2, 0.8]))
def test_regions_of_random_networks_run_op_by_op_are_exact(program, seed, recompute):
    """The same on random networks of random ops (`random_networks`: views, in-place
    writes, several outputs, buffers, draws), cut into regions as Inductor would run them."""
    width = 6
    torch.manual_seed(0)
    x = torch.randn(3, width)
    graph = compiled.fuse_for_inductor(lower_torch(RandomNet(program, width), (x,), cost_model="flops"))
    schedule = random_schedule(graph, random.Random(seed), recompute_share=recompute, defer_share=0.5)
    made = []

    def make(m):
        made.append(ScheduledModule(m, graph, schedule, backend="inductor"))
        return made[-1]

    torch.manual_seed(0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled.Region, "_compile", lambda region, tensors: region.eager)
        errors = side_by_side(RandomNet(program, width), make, (x,), {}, lambda out: out, steps=2,
                              outside=False)   # gradients handed whole, as above
    assert errors == {}, f"not bitwise equal to eager: {errors}"
    for region in made[0].runner(torch.device("cpu")).plan.regions:
        _assert_room_for_fusion(graph, schedule, region)


def _assert_room_for_fusion(graph, schedule, region):
    """A region is contiguous steps of the schedule, less views of values from before it
    that it would return (run eagerly before it: `codegen._Runs._escaping_views`), and
    what it can hold at once, the plan's memory before its first compute step plus
    everything its steps allocate (a fused kernel allocates its outputs at its start and
    frees its inputs at its end; Inductor may run a step at the region's start where
    nothing it reads is computed in the region), stays within the plan's peak at every
    step, with that step's workspace. It returns no view of its inputs, which the
    compiled function's wrapper would rebuild at every call, unless the value (or one it
    views) was computed or freed before in the run (a recomputation stays in place), or
    is another output of a node computing such a value again."""
    simulated = simulate(graph, schedule)
    ran = [k for k in region.steps if schedule.steps[k].HasField("compute")]
    assert [schedule.steps[k].compute for k in ran] == list(region.node_ids), \
        f"{region.name}'s nodes are not those of its steps {region.steps}"
    run = range(region.steps[0], region.steps[-1] + 1)
    for k in sorted(set(run) - set(region.steps)):
        assert schedule.steps[k].HasField("compute"), f"{region.name} leaves out step {k}, a free"
        node = graph.node(schedule.steps[k].compute)
        assert is_view(graph, node) and not node.mutating, \
            f"{region.name} leaves out {graph.describe_node(node.id)}, not a view"
    of_inputs = set(region.inputs)  # values viewing the region's inputs, through views
    named, renamed = set(), set()  # renamed: (views of) values recomputed after a free in the run
    for k in run:
        step = schedule.steps[k]
        if step.HasField("free"):
            named.add(step.free)
        elif k in ran:
            node = graph.node(step.compute)
            viewing = is_view(graph, node) and not node.mutating and of_inputs.issuperset(node.inputs)
            # A node computing again an output the run freed stays in place with all its
            # outputs (a split: hoisted, it would rebind every name it returns).
            again = not named.isdisjoint(node.outputs) or not renamed.isdisjoint(node.inputs)
            for v in node.outputs:
                (of_inputs.add if viewing else of_inputs.discard)(v)
                (renamed.add if again else renamed.discard)(v)
            named.update(node.outputs)
    for v in region.outputs:
        assert v in renamed or v not in of_inputs, f"{region.name} returns {graph.describe_value(v)}, a view of its input"
    held = simulated.memory_after[ran[0] - 1] if ran[0] else 0
    if ran[0] == schedule.backward_start:  # the buffer snapshots taken as the backward starts
        held += simulated.snapshot_bytes
    for k in ran:
        node = graph.node(schedule.steps[k].compute)
        held += allocated_bytes(graph, node)
        assert held + node.cost.workspace_bytes <= simulated.peak_bytes, \
            f"{region.name}: {graph.describe_node(node.id)} could take the region over the plan's peak"


@search(3, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_schedules_compiled_by_inductor_match_eager_within_their_planned_peak(seed):
    _compiled_within_planned_peak("mlp_dropout", seed)


@pytest.mark.slow  # the rule it pins is checked op by op on GPT-2 by `_assert_room_for_fusion`
def test_fused_kernels_keep_a_random_gpt2_schedule_within_its_planned_peak():
    """Inductor's fused kernels hold their inputs to their end and allocate their outputs
    at their start: this random schedule of tiny GPT-2 measured 1.0105 of its planned peak
    compiled (a GELU chain fused with the sum the plan frees first; the quick benchmark's
    GPT-2 plans up to 1.05) before regions were bounded by all they allocate
    (`codegen._Runs`), 0.9931 after. (Its seed-3 twin, 1.0041 before, 1.0000 after, is
    left out: each compiles about 60 regions, a minute on two cores.)"""
    _compiled_within_planned_peak("gpt2", 1)


#: Scalars made around the loss outside the plan's values, alive at any peak: two 4-byte
#: allocations outside regions (`aten::empty`, `aten::empty_strided`: the output gradient
#: autograd makes for `backward()` and the loss handed back), measured on the tiny GPT-2's
#: fused schedule whose peak has no slack (416,301 bytes against 416,293 planned).
LOSS_SCALARS_BYTES = 16


def _compiled_within_planned_peak(name, seed):
    """A random schedule of zoo model `name` run compiled: gradients within 1e-5 of eager's,
    and the measured peak at most the planned one."""
    graph = lowered(name, "isolated", backend="inductor")
    schedule = random_schedule(graph, random.Random(seed), recompute_share=0.5, defer_share=0.5)
    model, args, kwargs, loss_of = zoo_models.ZOO[name]()
    made = []

    def make(m):
        made.append(ScheduledModule(m, graph, schedule, backend="inductor"))
        return made[-1]

    side_by_side(model, make, args, kwargs, loss_of, tolerance=1e-5, model_scale=True)
    scheduled = made[0]
    for _ in range(2):
        scheduled.zero_grad(set_to_none=True)
        peak = measure_peak(lambda: loss_of(scheduled(*args, **kwargs)).backward(), "cpu").peak_bytes
    planned = simulate(graph, schedule).peak_bytes
    assert peak <= planned + LOSS_SCALARS_BYTES, f"measured {peak} bytes compiled, {planned} planned"


def test_torch_compile_of_a_scheduled_module_says_once_to_use_the_inductor_backend():
    model, args, kwargs, loss_of = zoo_models.ZOO["mlp_dropout"]("tiny")
    told = []
    scheduled = ScheduledModule(model, lowered("mlp_dropout"), _plan_at_half(lowered("mlp_dropout")),
                                notify=told.append)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    step = torch.compile(scheduled)
    for _ in range(2):
        loss_of(step(*args, **kwargs)).backward()
    assert len(told) == 1 and 'backend="inductor"' in told[0], told
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    assert breaks <= 1, dict(torch._dynamo.utils.counters["graph_break"])


def test_an_unknown_backend_is_refused_before_planning():
    model, args, kwargs, _ = zoo_models.ZOO["mlp_dropout"]("tiny")
    with pytest.raises(ValueError, match="backend must be one of 'eager', 'inductor', not 'tvm'"):
        remat_ir.remat(model, args, "50%", backend="tvm")


@pytest.mark.parametrize("name", ["gpt2", "straight_through"])
def test_a_step_writing_into_a_value_from_before_its_region_runs_eagerly(name):
    """Buffer reuse writes a backward result into a dying input (`mul.out(..., out=g)`).
    Inside a region Inductor keeps such an input to the region's end and computes into a
    fresh buffer, two buffers where the plan holds one; so a step writing into a value
    its region did not compute is an eager line, and regions hold only steps writing into
    their own values."""
    from remat_ir.ir import store_all
    from remat_ir.runtimes.codegen import mutated_inputs

    model, args, kwargs, _ = zoo_models.ZOO[name]("tiny")
    graph = lower_torch(model, args, example_kwargs=kwargs, cost_model=None)
    writers = [n.id for n in graph.proto.nodes if n.mutating and mutated_inputs(n)]
    assert writers, "buffer reuse rewrote nothing: the test checks nothing"
    runner = ScheduledModule(model, graph, store_all(graph), backend="inductor").runner(torch.device("cpu"))
    placed = 0
    for region in runner.plan.regions:
        produced: set[int] = set()
        for n in region.node_ids:
            node = graph.node(n)
            if node.mutating:
                assert mutated_inputs(node) <= produced, f"{graph.describe_node(n)} in {region.name}"
                placed += 1
            produced.update(node.outputs)
    source = runner.plan.forward_source + runner.plan.backward_source
    in_regions = {n for region in runner.plan.regions for n in region.node_ids}
    eager = [n for n in writers if n not in in_regions]
    assert eager and placed + len(eager) == len(writers)
    for n in eager:  # each as its own line, writing into the value it was given
        assert re.search(rf"^\s*v{graph.node(n).outputs[0]} = op_\w+\(", source, re.MULTILINE), \
            graph.describe_node(n)


def _peak_alone(fn, inputs):
    """The allocator peak of `fn` run on a fresh list of `inputs` (the second of two runs)."""
    for _ in range(2):
        peak = measure_peak(lambda: fn(list(inputs)), "cpu").peak_bytes
    return peak


def test_ops_kept_out_of_regions_hold_more_compiled_than_eagerly():
    """Why max_pool2d's backward is in `compiled.EAGER_OPS`: on a channels-last input,
    Inductor's lowering of it holds twice what the op holds eagerly (a contiguous zeroed
    buffer and a copy into the output's layout), which the plan, measured eagerly, does
    not count. If a torch upgrade makes this fail, the op may leave the list."""
    import operator

    aten = torch.ops.aten
    x = torch.randn(2, 8, 16, 16).to(memory_format=torch.channels_last)
    out, indices = aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
    fx = torch.fx.Graph()
    boxed = fx.placeholder("inputs")
    boxed.meta["steal_arg"] = True
    grad, inp, idx = (fx.call_function(operator.getitem, (boxed, i)) for i in range(3))
    op = aten.max_pool2d_with_indices_backward.default
    fx.output((fx.call_function(op, (grad, inp, [3, 3], [2, 2], [1, 1], [1, 1], False, idx)),))
    module = torch.fx.GraphModule(torch.nn.Module(), fx)
    inputs = [torch.randn_like(out), x, indices]
    fused = compiled.compile_boxed(module, inputs)  # as a region compiles
    eager_peak = _peak_alone(lambda xs: module(xs), inputs)
    assert _peak_alone(fused, inputs) >= 2 * eager_peak
    assert "aten.max_pool2d_with_indices_backward.default" in compiled.EAGER_OPS


class _TwoBlocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
                                          for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x.square().mean()


def test_a_model_wrapped_by_torch_compile_says_the_eager_backend_runs_it_op_by_op(capsys):
    """Tracing goes through the wrapper: the plan trains bitwise like the uncompiled
    model, op by op, which a user who compiled for speed would not guess (nothing said
    before). With the Inductor backend nothing is said."""
    x = torch.randn(4, 8)
    torch.manual_seed(0)
    errors = side_by_side(_TwoBlocks(), lambda m: remat_ir.remat(torch.compile(m), (x,), solver="autograd",
                                                                 cost_model="flops"),
                          (x,), {}, lambda loss: loss, tolerance=1e-30)
    assert errors == {}
    said = capsys.readouterr().err
    assert said.count("remat-ir: the model (_TwoBlocks) is compiled with torch.compile; remat-ir traces the "
                      "code it wraps and the eager backend runs the plan op by op") == 1
    model = _TwoBlocks()
    model.blocks[1] = torch.compile(model.blocks[1])
    remat_ir.remat(model, (x,), solver="autograd", cost_model="flops")
    assert "remat-ir: blocks.1 is compiled with torch.compile" in capsys.readouterr().err
    remat_ir.remat(model, (x,), solver="autograd", cost_model="flops", backend="inductor")
    assert "torch.compile" not in capsys.readouterr().err


@torch.compile
def _compiled_gelu(x):
    return torch.nn.functional.gelu(x) * 1.5


class _CompiledParts(torch.nn.Module):
    """torch.compile applied four ways that do not wrap a module: in place, a function
    held, a global function called, a method decorated."""

    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.second.compile()
        self.act = torch.compile(torch.tanh)

    def forward(self, x):
        return self.act(self.second(_compiled_gelu(self.first(x)))).square().mean() + self.penalty(x)

    @torch.compile
    def penalty(self, x):
        return x.abs().mean() * 0.1


def test_parts_compiled_in_place_or_as_functions_are_said_too(capsys):
    """Only a module wrapped by torch.compile was said; compiled in place
    (`module.compile()`), held as a function, or called as a compiled global function,
    the plan ran them op by op with nothing said, and a comparison with the compiled
    model found gradients 1e-7 off. The plan trains bitwise like the uncompiled model."""
    x = torch.randn(4, 8)
    torch.manual_seed(0)
    model = _CompiledParts()
    uncompiled = copy_model(model)
    uncompiled.second._compiled_call_impl = None
    uncompiled.act = torch.tanh
    from remat_ir.frontends.compiled_parts import compiled_parts

    assert compiled_parts(model) == ["act", "_CompiledParts.penalty", "_compiled_gelu of test_compiled",
                                     "second (compiled in place by .compile())"]
    scheduled = remat_ir.remat(model, (x,), solver="recompute-all", cost_model="flops")
    said = capsys.readouterr().err
    assert ("remat-ir: act, _CompiledParts.penalty, _compiled_gelu of test_compiled and 1 more are "
            "compiled with torch.compile; remat-ir traces the code it wraps") in said
    scheduled(x).backward()
    with torch.compiler.set_stance("force_eager"):
        uncompiled(x).backward()
    for (name, p), q in zip(uncompiled.named_parameters(), model.parameters()):
        assert torch.equal(p.grad, q.grad), name


class _ScatterMax(torch.nn.Module):
    """A segment maximum (`scatter_reduce(reduce="amax")`), whose backward passes the
    gradient where the input equals the maximum, beside other ops that cut the step into
    several compiled regions (a review's model)."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = (torch.nn.Linear(16, 16) for _ in range(3))

    def forward(self, x, idx):
        rows, width = x.shape
        position = torch.arange(rows, dtype=x.dtype).unsqueeze(1)
        table = torch.zeros(rows, width)
        table[:, 0::2] = torch.sin(position * 0.1)
        table[:, 1::2] = torch.cos(position * 0.1)
        buf = torch.ones(rows, width)
        a, b = buf.split(8, -1)
        a.fill_(0.5)
        b.copy_(table[:, :8])
        buf.unbind(1)[0].add_(1.0)
        buf.diagonal().fill_(2.0)
        buf.view(-1)[::7] = 3.0
        h = self.l1(x + table) * buf
        g = torch.zeros(rows, width)
        g.index_fill_(1, torch.tensor([1, 3]), 0.25)
        g.put_(torch.tensor([0, 5, 5, 17]), torch.tensor([1.0, 2.0, 3.0, 4.0]), accumulate=True)
        h2 = self.l2(h + g)
        index = idx.unsqueeze(1).expand(-1, width)
        r = torch.zeros(32, width).scatter_reduce(0, index, h2, reduce="amax", include_self=False)
        r2 = torch.ones(32, width).scatter_reduce(0, index, h2.round(), reduce="mean", include_self=True)
        copied = h2.clone().index_copy(0, torch.tensor([2, 4, 6]), r[:3] + r2[:3])
        scattered = torch.zeros(rows, width).masked_scatter(h2 > 0, h2 * 2)
        return self.l3(copied + scattered).tanh().sum()


def test_values_a_backward_compares_are_not_recomputed_in_another_region():
    """`eq(input, amax)` in a backward passes a gradient only where the two are bitwise
    equal: a recomputation compiled into another region than the forward's rounded
    otherwise, and the gradients came out 5% off eager's, silently (found by a review).
    Compared values are kept from the forward (`frontends/compared_values.py`)."""
    torch.manual_seed(0)
    model = _ScatterMax()
    x, idx = torch.randn(128, 16, requires_grad=True), torch.tensor([3, 1, 3, 0, 7, 7, 2, 5] * 16)
    graph = lower_torch(model, (x, idx), cost_model="flops", backend="inductor")
    kept = [n for n in graph.proto.nodes if n.non_recomputable]
    assert any(n.op == "aten.addmm.default" for n in kept)   # what the amax's backward compares
    side_by_side(model, lambda m: remat_ir.remat(m, (x, idx), solver="recompute-all", cost_model="flops",
                                                  backend="inductor"),
                 (x, idx), {}, lambda loss: loss, tolerance=1e-5, model_scale=True)   # raises beyond


def test_a_model_holding_a_remat_module_is_not_said_to_be_compiled():
    """remat-ir's module hands `torch.compile` calls to a `torch.compiler.disable`d method,
    which carries the attribute compiled functions do: a model holding one (remat of a
    model with a remat-ir submodule) was said to be "compiled with torch.compile" (found
    by a review)."""
    from remat_ir.frontends.compiled_parts import compiled_parts

    x = torch.randn(2, 4)
    model = torch.nn.Sequential(remat_ir.remat(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()), (x,),
                                               cost_model="flops"), torch.nn.Linear(4, 1))
    assert compiled_parts(model) == []


class _TransposedLogSoftmax(torch.nn.Module):
    """Log probabilities transposed to (time, batch, classes), as a CTC loss takes them,
    then a loss read through a copy: the backward of the log-softmax gets a transposed
    gradient."""

    def __init__(self):
        super().__init__()
        self.inner, self.out = torch.nn.Linear(8, 16), torch.nn.Linear(16, 6)

    def forward(self, x, weights):
        log_probs = torch.log_softmax(self.out(torch.tanh(self.inner(x))), dim=-1).transpose(0, 1)
        return (log_probs.contiguous() * weights).sum()


def test_every_region_of_a_transposed_log_softmax_compiles(capsys):
    """The kernel of `_log_softmax_backward_data` lays a transposed gradient's result out
    contiguously (the graph records that), its meta kernel as the gradient: Inductor's
    trace of the region had a `view` it could not take, and the region ran eagerly."""
    torch.manual_seed(0)
    x, weights = torch.randn(3, 10, 8), torch.randn(10, 3, 6)
    model = _TransposedLogSoftmax()
    eager = copy_model(model)
    scheduled = remat_ir.remat(model, (x, weights), solver="recompute-all", cost_model="flops",
                               backend="inductor")
    scheduled(x, weights).backward()
    eager(x, weights).backward()
    assert "could not compile" not in capsys.readouterr().err
    for ours, theirs in zip(model.parameters(), eager.parameters()):
        assert relative_error(ours.grad, theirs.grad) <= 1e-5


class _GeluMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(16, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 4)
        self.drop = torch.nn.Dropout(0.2)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.a(x))
        return self.c(self.drop(torch.tanh(self.b(h)) + h))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_inductor_under_autocast_rounds_as_eagers_kernels(dtype):
    """hunt81 F1: a fused kernel kept its 16-bit intermediates in float32 where eager's
    kernels round each: gradients 1.2e-3 of the largest off eager's under bfloat16, 0.1
    after three float16 steps. Inductor now rounds as eager does
    (`emulate_precision_casts` in `runtimes/compiled.INDUCTOR_OPTIONS`)."""
    torch.manual_seed(0)
    x = torch.randn(64, 16)
    side_by_side(_GeluMLP(), lambda m: remat_ir.remat(m, (x,), solver="recompute-all", cost_model="flops",
                                                     backend="inductor", cache_dir=False),
                 (x,), {}, lambda out: out.float().square().mean(), steps=3, tolerance=1e-5, model_scale=True,
                 forward_context=lambda: torch.autocast("cpu", dtype=dtype))
