"""Costs for the inductor backend (`runtimes/compiled_costs.py`): each compiled region of
the store-everything step timed as a whole, its time shared among its nodes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import remat_ir
from remat_ir import ir
from remat_ir.ir import pb
from remat_ir.lowering import lower_torch
from remat_ir.runtimes.codegen import generate
from remat_ir.runtimes.compiled_costs import is_library_op, share_region_times
from remat_ir.runtimes.timing import time_schedule
from remat_ir.runtimes.torch import resident_values

import zoo_models
from strategies import search

OPS = ("aten.mm.default", "aten.convolution.default", "aten.mul.Tensor", "aten.add.Tensor",
       "aten.native_layer_norm.default")


def _chain(ops: list[str]) -> ir.Graph:
    """One node per op, each reading the previous one's output (only the ops matter here)."""
    g = ir.Graph(name="chain")
    v = g.add_value("x", "float32", (4,), kind="user_input")
    g.add_input(v)
    for i, op in enumerate(ops):
        out = g.add_value(f"v{i}", "float32", (4,))
        g.add_node(op, [v], [out], phase="forward", name=f"n{i}")
        v = out
    return g


@search(200)
@given(ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=8),
       eager=st.lists(st.one_of(st.just(0.0), st.floats(1e-9, 1.0)), min_size=8, max_size=8),
       region_s=st.floats(1e-6, 5.0), cut=st.integers(0, 8))
def test_a_region_time_is_shared_among_its_nodes(ops, eager, region_s, cut):
    graph = _chain(ops)
    ids = [n.id for n in graph.proto.nodes]
    regions = [ids[:cut], ids[cut:]]
    eager_s = dict(zip(ids, eager))
    costs = share_region_times(graph, regions, {0: region_s, 1: region_s / 2}, eager_s)
    assert set(costs) == set(ids)
    for index, nodes in enumerate(regions):
        if not nodes:
            continue
        total = region_s / (index + 1)
        library = [n for n in nodes if is_library_op(graph.node(n).op)]
        fused = [n for n in nodes if n not in library]
        assert all(costs[n] >= 0 for n in nodes)
        if sum(eager_s[n] for n in nodes) > 0:
            assert sum(costs[n] for n in nodes) == pytest.approx(total, rel=1e-9)
        if sum(eager_s[n] for n in fused) > 0 and total >= sum(eager_s[n] for n in library):
            # library kernels run as they ran op by op; the fused ops take what is left
            assert all(costs[n] == eager_s[n] for n in library)
        else:  # every node gets the same share of its op-by-op time
            share = total / sum(eager_s[n] for n in nodes) if sum(eager_s[n] for n in nodes) else 0.0
            assert all(costs[n] == pytest.approx(eager_s[n] * share, rel=1e-9, abs=1e-15) for n in nodes)


def test_compiled_timing_ticks_every_region_and_every_step_outside_them():
    """The store-everything step of a model with dropout (random nodes stay outside
    regions) timed on the inductor backend: each compute step is timed once, either in
    its region or by itself, in the regions a single-process training step runs (one
    gradient group: a group's yield would cut a region). The MLP with dropout, whose few
    regions compile in 21 s with a cold Inductor cache, as on every CI machine (a 1-layer
    GPT-2's took 48 s)."""
    model, args, kwargs, _ = zoo_models.mlp_dropout()
    graph = lower_torch(model, args, example_kwargs=kwargs, cost_model=None)
    store = ir.store_all(graph)
    timing = time_schedule(graph, store, resident_values(model, graph, args, kwargs), "cpu",
                           backend="inductor", steps=2)
    _, _, plan = generate(graph, store, torch.device("cpu"), backend="inductor", gradient_groups=1)
    assert [r.node_ids for r in plan.regions] == timing.regions and timing.regions
    in_regions = [n for nodes in timing.regions for n in nodes]
    alone = [n for n, _ in timing.occurrences if n >= 0]
    computed = ir.compute_sequence(store)
    assert sorted(in_regions + alone) == sorted(computed)
    assert set(timing.region_seconds()) == set(range(len(timing.regions)))
    assert any(graph.node(n).random for n in alone)  # dropout's draws run outside regions


def test_inductor_costs_are_recorded_and_cached_apart(tmp_path):
    """`remat(..., backend="inductor")` plans on compiled costs, recorded as such, and the
    plan cache keeps them apart from op-by-op costs of the same trace."""
    model, args, kwargs, loss_of = zoo_models.mlp_dropout()
    # At 98% of this graph's peak, whether a plan is found depended on how the time limit's
    # shares fell on a loaded machine (hiremate's Checkmate MILP, or its other plans with
    # annealing off, found one at 88%; with annealing on and the MILP starved, none): the
    # budget was refused twice in full-suite runs. At 90% every path finds that plan in
    # under a second.
    compiled = remat_ir.remat(model, args, example_kwargs=kwargs, budget="90%", backend="inductor",
                              cache_dir=tmp_path, time_limit_s=20)
    record = compiled.graph.proto.provenance.cost_model
    assert (record.name, record.backend, record.timed_schedule) == ("profile", "inductor", "store_all")
    assert record.peak_byte_s == 0 and "not calibrated on compiled steps" in record.note
    assert all(n.cost.source == pb.TIMED_IN_STEP for n in compiled.graph.proto.nodes)
    eager = remat_ir.remat(model, args, example_kwargs=kwargs, budget="90%", cache_dir=tmp_path, time_limit_s=20)
    assert eager.graph.proto.provenance.cost_model.backend == "eager"
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 2
    loss_of(compiled(*args, **kwargs)).backward()


def test_lowering_for_an_unknown_backend_is_refused_in_one_line():
    with pytest.raises(ValueError, match="backend must be one of 'eager', 'inductor', not 'tvm'"):
        lower_torch(torch.nn.Linear(2, 2), (torch.randn(1, 2),), backend="tvm")
