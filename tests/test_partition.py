"""H-Partition: every node in exactly one cluster, clusters small and cycle-free,
the top small, identical transformer blocks recognised, the tree stored in the IR."""

from __future__ import annotations

import random
from collections import Counter

import networkx as nx
import pytest
from builders import chain
from hypothesis import given
from hypothesis import strategies as st
from strategies import repeated_block_graphs, search, training_graphs

from remat_ir import ir, solvers
from remat_ir.ir import pb
from remat_ir.solvers import BadRequest, InfeasibleBudget
from remat_ir.solvers.baselines import store_all
from remat_ir.solvers.hiremate import hiremate
from remat_ir.solvers.partition import partition, store_hierarchy


def check_tree(graph: ir.Graph, tree, max_cluster: int, max_top: int) -> None:
    forward = graph.phase_order(pb.FORWARD)
    backward = graph.phase_order(pb.BACKWARD)
    clusters = tree.clusters()
    placed = Counter(n for c in clusters for n in c.nodes + c.attached)
    assert placed == Counter(forward), "every forward node in exactly one cluster"
    attached = Counter(b for c in clusters for b in c.backward)
    assert attached == Counter(backward), "every backward node attached exactly once"
    for c in clusters:
        parts = len(c.nodes) + len(c.children)
        assert parts <= (max_top if c is tree.root else max_cluster), (c.id, parts)
        assert all(k.level < c.level for k in c.children)
        assert c.level == 1 + max((k.level for k in c.children), default=-1)
    # Each cluster is convex in the forward graph (no path leaves it and comes back),
    # so contracting it leaves a DAG.
    deps = graph.dependency_graph().subgraph(forward)
    for c in clusters:
        inside = set(c.forward_nodes())
        leaving = {s for n in inside for s in deps.successors(n) if s not in inside}
        reached = set().union(*(nx.descendants(deps, s) for s in leaving))
        assert not inside & reached, c.id


def test_gpt2_partition_is_a_valid_tree_and_recognises_the_blocks(gpt2_graph, tmp_path):
    tree = partition(gpt2_graph, max_cluster=20, max_top=30)
    check_tree(gpt2_graph, tree, 20, 30)
    # The three transformer blocks are identical: their clusters come in threes.
    big = Counter(c.signature for c in tree.clusters() if len(c.forward_nodes()) >= 5)
    assert max(big.values()) >= 3 and sum(1 for k in big.values() if k % 3 == 0) >= 3, big
    store_hierarchy(gpt2_graph, tree)
    ir.validate(gpt2_graph)  # raises InvalidGraph naming the problem
    again = ir.load(ir.save(gpt2_graph, tmp_path / "gpt2.rir"))
    assert again.proto.hierarchy == gpt2_graph.proto.hierarchy
    assert again.proto.hierarchy.root_id == tree.root.id


def test_blocks_whose_timings_differ_are_still_recognised_and_solved_once(gpt2_graph):
    """Profiled costs are timed in the order the step runs, so identical blocks get
    different times (1.5x apart at the median for the same op on the same shapes in a
    GPT-2): the signature is structural, and hiremate solves each structure once, its
    options measured again on each copy's own costs (a plan valid within the budget)."""
    noisy = ir.Graph(ir.loads(ir.dumps(gpt2_graph)).proto)
    noisy.proto.ClearField("hierarchy")
    rng = random.Random(0)
    for node in noisy.proto.nodes:
        node.cost.time_s *= rng.uniform(0.5, 2.0)
    flat, timed = partition(gpt2_graph), partition(noisy)
    assert [c.signature for c in timed.clusters()] == [c.signature for c in flat.clusters()]
    below = [c for c in timed.clusters() if c is not timed.root]
    repeated = Counter(c.signature for c in below)
    assert max(repeated.values()) >= 3, repeated
    def structures_solved(graph: ir.Graph) -> tuple[int, pb.Schedule]:
        said: list[str] = []
        budget = int(0.6 * store_all(graph).predicted_peak_bytes)
        plan = hiremate(graph, budget, progress=said.append, anneal=False)
        return sum(1 for line in said if "structures solved" in line), plan

    flat_graph = ir.Graph(ir.loads(ir.dumps(gpt2_graph)).proto)
    flat_graph.proto.ClearField("hierarchy")
    solved, plan = structures_solved(noisy)
    assert solved == structures_solved(flat_graph)[0] < len(below), (solved, len(below))
    budget = int(0.6 * store_all(noisy).predicted_peak_bytes)
    result = ir.simulate(noisy, plan)
    assert result.valid, result.violation
    assert result.peak_bytes <= budget


@search(20)
@given(graph=repeated_block_graphs(), share=st.floats(0.3, 1.0))
def test_hiremate_reusing_a_blocks_options_on_copies_timed_apart_is_valid_within_budget(graph, share):
    """Small clusters, so that repeated blocks make clusters of equal signature whose
    nodes differ in time: the options hiremate maps onto a copy make a valid plan within
    the budget, or a refusal whose named budget is met."""
    budget = max(1, int(share * store_all(graph).predicted_peak_bytes))
    options = dict(time_limit_s=30, max_cluster=3, max_top=3)
    try:
        plan = solvers.solve(graph, budget, "hiremate", **options)
    except InfeasibleBudget as refused:
        assert refused.smallest_feasible is not None and refused.smallest_feasible > budget
        budget = refused.smallest_feasible
        plan = solvers.solve(graph, budget, "hiremate", **options)
    result = ir.simulate(graph, plan)
    assert result.valid, result.violation
    assert result.peak_bytes <= budget


def test_long_chain_needs_several_levels():
    graph, _ = chain(60)
    tree = partition(graph, max_cluster=4, max_top=3)
    check_tree(graph, tree, 4, 3)
    assert tree.root.level >= 2 and len(tree.root.children) + len(tree.root.nodes) <= 3


@search(60)
@given(graph=training_graphs(), max_cluster=st.integers(2, 5), max_top=st.integers(2, 5))
def test_random_graphs_partition_into_valid_trees(graph, max_cluster, max_top):
    check_tree(graph, partition(graph, max_cluster=max_cluster, max_top=max_top),
               max_cluster, max_top)


def test_bad_limits_are_named():
    graph, _ = chain(3)
    with pytest.raises(BadRequest, match="max_cluster must be at least 2"):
        partition(graph, max_cluster=1)
    with pytest.raises(BadRequest, match="max_top must be at least 2"):
        partition(graph, max_top=1)


def test_cli_partition_and_plot_write_the_tree_and_pngs(tmp_path):
    import subprocess
    import sys
    graph, _ = chain(40)
    path = ir.save(graph, tmp_path / "chain.rir")
    tree_file = tmp_path / "tree.rir"

    def run(*args):
        return subprocess.run([sys.executable, "-m", "remat_ir", *args], capture_output=True, text=True)

    done = run("partition", str(path), "--max-cluster", "5", "--max-top", "4", "-o", str(tree_file))
    assert done.returncode == 0, done.stderr
    stored = ir.load(tree_file).proto.hierarchy
    assert len(stored.clusters) >= 3 and stored.HasField("root_id")
    assert "parts at the top" in done.stdout
    done = run("solve", str(tree_file), "--budget", "50%", "-o", str(tree_file))
    assert done.returncode == 0, done.stderr
    done = run("plot", str(tree_file), "-o", str(tmp_path / "chain"))
    assert done.returncode == 0, done.stderr
    for kind in ("memory", "partition"):
        png = tmp_path / f"chain-{kind}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    done = run("plot", str(tree_file), "--schedule", "nope", "-o", str(tmp_path / "x"))
    assert done.returncode == 2 and "has no schedule 'nope'" in done.stderr
    done = run("partition", str(path), "--max-top", "1", "-o", str(tree_file))
    assert done.returncode == 2 and "max_top must be at least 2" in done.stderr
    assert "Traceback" not in done.stderr
