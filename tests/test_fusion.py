"""Fused nodes (`ir.fusion`): pointwise chains a compiling backend runs as one kernel are
one node for the planner, with the members' costs and no memory for intermediates."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remat_ir import ir
from remat_ir.ir import pb, simulate, store_all
from remat_ir.ir.errors import InvalidGraph
from remat_ir.ir.fusion import FUSED_OP, body_nodes, fuse, fusion_groups, is_fused

from strategies import search, training_graphs
from exactness import lowered


@search(150)
@given(graph=training_graphs(), data=st.data())
def test_fusing_any_nodes_keeps_a_valid_graph_whose_groups_are_read_only_at_their_root(graph, data):
    node_ids = [n.id for n in graph.proto.nodes]
    fusable = data.draw(st.sets(st.sampled_from(node_ids)))
    groups = fusion_groups(graph, fusable)
    grouped = [n for group in groups for n in group]
    assert len(grouped) == len(set(grouped)), "a node is in two groups"
    for group in groups:
        assert len(group) >= 2 and set(group) <= fusable
        assert len({graph.node(n).phase for n in group}) == 1
        for member in group[:-1]:  # only the root has readers outside the group, or is an output
            for v in graph.node(member).outputs:
                assert set(graph.users(v)) <= set(group)
                assert v not in graph.output_value_ids
    for node in graph.proto.nodes:  # two timelines' costs (CUDA) are summed like time_s
        node.cost.host_s, node.cost.device_s = node.cost.time_s / 3, node.cost.time_s / 5
    fused = fuse(graph, fusable)
    ir.validate(fused)  # no cycle, every read produced before it is needed
    assert len(fused.proto.nodes) == len(node_ids) - sum(len(g) - 1 for g in groups)
    internal = {v for g in groups for m in g[:-1] for v in graph.node(m).outputs}
    assert set(fused.values) == set(graph.values) - internal
    for field in ("time_s", "host_s", "device_s"):
        assert sum(getattr(n.cost, field) for n in fused.proto.nodes) == pytest.approx(
            sum(getattr(n.cost, field) for n in graph.proto.nodes))
    for group in groups:
        node = fused.node(group[-1])
        assert is_fused(node) and [m.id for m in body_nodes(node)] == group
        assert list(node.outputs) == list(graph.node(group[-1]).outputs)
        assert node.cost.workspace_bytes == 0
    result = simulate(fused, store_all(fused))
    assert result.violation is None
    # Round trip: the body survives serialization.
    again = ir.loads(ir.dumps(fused))
    assert [list(n.body) for n in again.proto.nodes] == [list(n.body) for n in fused.proto.nodes]


def test_a_planned_graph_is_not_fused():
    graph = lowered("mlp_dropout")
    planned = ir.Graph(pb.Graph.FromString(graph.proto.SerializeToString()))
    planned.add_schedule(store_all(planned))
    with pytest.raises(InvalidGraph, match="fuse first, then plan"):
        fuse(planned, [n.id for n in planned.proto.nodes])


def test_a_fused_node_whose_member_reads_what_nothing_provides_is_invalid():
    graph = lowered("gpt2", backend="inductor")
    proto = pb.Graph.FromString(graph.proto.SerializeToString())
    node = next(n for n in proto.nodes if n.op == FUSED_OP)
    node.body[-1].inputs.append(10**9)
    problems = ir.find_problems(proto)
    assert any("which neither the fused node's inputs nor earlier members provide" in p for p in problems)


def test_gpt2_gelu_chains_fuse_and_random_nodes_never_do():
    """Tiny GPT-2 for the inductor backend: each GELU's tanh chain is one forward node and
    its derivative one backward node; dropout, matrix products and views stay apart."""
    plain, fused = lowered("gpt2"), lowered("gpt2", backend="inductor")
    bodies = [[m.op.split(".")[1] for m in n.body] for n in fused.proto.nodes if is_fused(n)]
    forward = [n for n in fused.proto.nodes if is_fused(n) and n.phase == pb.FORWARD]
    backward = [n for n in fused.proto.nodes if is_fused(n) and n.phase == pb.BACKWARD]
    assert any("tanh" in [m.op.split(".")[1] for m in n.body] for n in forward)
    assert backward, bodies
    members = [m for n in fused.proto.nodes for m in n.body]
    assert not any(m.random or m.mutating for m in members)
    assert not any(m.op.split(".")[1] in ("mm", "addmm", "bmm", "view") for m in members)
    # The planner sees less memory: store-everything's peak does not rise.
    assert simulate(fused, store_all(fused)).peak_bytes <= simulate(plain, store_all(plain)).peak_bytes
    # A fused node differentiating a node fused into another group names that group's node.
    assert ir.find_problems(fused) == []


def test_batchnorm_normalization_fuses_with_its_relu_for_a_fusing_backend():
    """For the inductor backend the training BatchNorm is its statistics and a pointwise
    normalization (`frontends.torch.FUSING_DECOMPOSITIONS`): the normalization and the
    ReLU after it are one fused node, which a plan can run again from the convolution's
    output and the saved statistics; its backward is still `native_batch_norm_backward`."""
    plain, fused = lowered("cnn_batchnorm"), lowered("cnn_batchnorm", backend="inductor")
    ops = {n.op for n in fused.proto.nodes}
    assert "aten._native_batch_norm_legit_functional.default" in {n.op for n in plain.proto.nodes}
    assert "aten._native_batch_norm_legit_functional.default" not in ops
    assert "aten.native_batch_norm_backward.default" in ops
    bodies = [[m.op for m in n.body] for n in fused.proto.nodes if is_fused(n) and n.phase == pb.FORWARD]
    normalizing = [b for b in bodies if "aten.sub.Tensor" in b and b[-1] == "aten.relu.default"]
    assert len(normalizing) == 3, bodies  # one per convolution block of the zoo model
    assert ir.find_problems(fused) == []   # each backward names the fused node it differentiates


@pytest.mark.parametrize("seed", [0, 1])
def test_the_eager_backend_runs_a_fused_graph_member_by_member_bitwise(seed):
    """Outside compiled regions a fused node runs its members one by one (`codegen`), so a
    fused graph run eagerly under a random schedule gives eager's bits."""
    import random

    import torch

    import zoo_models
    from exactness import random_schedule, side_by_side
    from remat_ir.runtimes.compiled import fuse_for_inductor
    from remat_ir.runtimes.torch import ScheduledModule

    graph = fuse_for_inductor(lowered("gpt2"))
    assert any(is_fused(n) for n in graph.proto.nodes)
    schedule = random_schedule(graph, random.Random(seed), recompute_share=0.5, defer_share=0.5)
    model, args, kwargs, loss_of = zoo_models.ZOO["gpt2"]()
    made = []

    def make(m):
        made.append(ScheduledModule(m, graph, schedule))
        return made[-1]

    assert side_by_side(model, make, args, kwargs, loss_of, steps=2) == {}
    plan = made[0].runner(torch.device("cpu")).plan
    assert "op_aten_tanh_default(" in plan.forward_source  # a fused member, called by itself


def test_costs_of_a_fused_graph_are_refused_in_one_line():
    from remat_ir.lowering import add_costs

    with pytest.raises(ValueError, match="is a fused node: costs are measured on the graph before fusing"):
        add_costs(lowered("mlp_dropout", backend="inductor"), "isolated")
