"""hiremate plans with the partition tree stored in the graph (`remat-ir partition`,
an earlier run), reads back exactly the tree the partitioner made, and refuses a
stored tree that does not partition the forward graph."""

from __future__ import annotations

import pytest
from builders import chain
from hypothesis import given
from strategies import search, training_graphs

from remat_ir import ir, solvers
from remat_ir.solvers.base import BadRequest
from remat_ir.solvers.partition import partition, store_hierarchy, stored_partition


def _shape(tree):
    return sorted((c.id, c.level, tuple(c.nodes), tuple(sorted(c.attached)), tuple(c.backward),
                   tuple(sorted(c.owner.items(), key=str)), tuple(k.id for k in c.children),
                   c.signature) for c in tree.clusters())


@search(40)
@given(training_graphs())
def test_a_stored_tree_reads_back_as_the_partitioner_made_it(g):
    tree = partition(g, max_cluster=3, max_top=3)
    store_hierarchy(g, tree)
    again = stored_partition(ir.loads(ir.dumps(g)))
    assert _shape(again) == _shape(tree)
    assert (again.rounds == 0) == (tree.rounds == 0)


def test_hiremate_uses_the_stored_tree_and_says_so():
    g, _ = chain(40)
    tree = partition(g, max_cluster=4, max_top=4)
    store_hierarchy(g, tree)
    stored = ir.dumps(g)
    said = []
    with_stored = solvers.solve(ir.loads(stored), "60%", "hiremate", progress=said.append)
    assert any("using the partition tree stored in the graph" in m for m in said)
    # Without a stored tree, hiremate partitions with its defaults: another tree.
    fresh = ir.loads(stored)
    fresh.proto.hierarchy.Clear()
    said.clear()
    solvers.solve(fresh, "60%", "hiremate", progress=said.append)
    assert not any("stored in the graph" in m for m in said)
    assert _shape(stored_partition(fresh)) != _shape(tree)
    # With the same tree given explicitly, the plan is the stored tree's plan.
    explicit = ir.loads(stored)
    explicit.proto.hierarchy.Clear()
    again = solvers.solve(explicit, "60%", "hiremate", max_cluster=4, max_top=4)
    assert list(again.steps) == list(with_stored.steps)


@pytest.mark.parametrize("damage, message", [
    (lambda h: h.clusters[0].node_ids.remove(h.clusters[0].node_ids[0]), "out"),
    (lambda h: h.clusters[1].node_ids.append(h.clusters[0].node_ids[0]), "in two clusters"),
    (lambda h: h.clusters[-1].children.append(987654), "does not exist"),
    (lambda h: h.ClearField("root_id"), "no root"),
])
def test_a_damaged_stored_tree_is_refused_with_what_to_do(damage, message):
    g, _ = chain(40)
    store_hierarchy(g, partition(g, max_cluster=4, max_top=4))
    damage(g.proto.hierarchy)
    with pytest.raises(BadRequest, match=message) as refused:
        solvers.solve(g, "60%", "hiremate")
    assert "remat-ir partition" in str(refused.value)


def test_a_non_convex_stored_cluster_is_refused():
    g, ids = chain(6)
    h = g.proto.hierarchy
    f = [ids[f"f{i}"] for i in range(1, 7)]
    h.clusters.add(id=0, level=0, node_ids=[f[1], f[3]])       # f3 runs between f2 and f4
    h.clusters.add(id=1, level=1, node_ids=[f[0], f[2], *f[4:]], children=[0])
    h.root_id = 1
    with pytest.raises(BadRequest, match="convex"):
        stored_partition(g)
