"""HiRemate's leaf solvers: a cluster cut out as a graph of its own is a valid training
graph whose schedules become options measured in the full graph; hiremate with leaf
solvers stays valid within its budget; bad solver names are refused up front."""

from __future__ import annotations

import pytest
from builders import chain
from hypothesis import given
from hypothesis import strategies as st
from strategies import search, training_graphs

from remat_ir import ir, solvers
from remat_ir.ir import pb
from remat_ir.solvers import BadRequest, UnknownSolver
from remat_ir.solvers.base import Deadline
from remat_ir.solvers.leaves import leaf_options, leaf_solver_names
from remat_ir.solvers.options import PartShape
from remat_ir.solvers.partition import partition
from remat_ir.solvers.structure import TrainingGraph
from remat_ir.solvers.subgraph import compute_sequences, part_graph


def leaf_clusters(graph: ir.Graph, **limits):
    tg = TrainingGraph(graph)
    for cluster in partition(graph, **limits).clusters():
        if not cluster.children and any(c.backward for c in cluster.walk()):
            forward = sorted(cluster.forward_nodes(), key=tg.position.__getitem__)
            backward = sorted(cluster.backward, key=tg.position.__getitem__)
            yield tg, forward, backward


def test_a_chain_link_cut_out_reads_its_input_and_output_gradient():
    graph, ids = chain(6)
    tg = TrainingGraph(graph)
    forward = [ids["f2"], ids["f3"]]
    backward = [b for b in tg.backward if graph.node(b).forward_node_id in forward]
    part = part_graph(graph, forward, backward, "links 2-3")
    assert sorted(part.nodes) == sorted(forward + backward)
    inputs = {part.value(i.value_id).name: part.value(i.value_id).kind for i in part.proto.inputs}
    # f2 reads f1's result; the backward reads the gradient of f3's result from b4.
    assert pb.USER_INPUT in inputs.values() and pb.GRADIENT in inputs.values()
    assert len(inputs) == 2
    roles = sorted(o.role for o in part.proto.outputs)
    assert roles == [pb.USER_OUTPUT, pb.INPUT_GRADIENT]
    # store-everything of the part is a schedule the full graph's measure accepts
    sequences = compute_sequences(ir.store_all(part), forward, backward)
    assert sequences == (forward, backward)


def test_the_context_makes_a_peak_budget_bound_the_saved_bytes():
    """Links 2-3 of a chain save a2 (1000 bytes) for b3. Cut out alone, the part's peak
    is in its backward and does not fall by dropping a2; with the context between its
    forward and backward, it does, and checkmate's plan at that peak recomputes f2."""
    graph, ids = chain(6)
    tg = TrainingGraph(graph)
    forward, backward = [ids["f2"], ids["f3"]], [ids["b3"], ids["b2"]]
    alone = part_graph(graph, forward, backward, "alone")
    with pytest.raises(solvers.InfeasibleBudget):
        solvers.solve(alone, ir.store_all(alone).predicted_peak_bytes - 1000, "checkmate")
    part = part_graph(graph, forward, backward, "in context", context_bytes=10**6)
    assert [part.node(n).op for n in part.phase_order(pb.BACKWARD)][0] == "remat.context_backward"
    assert [part.node(n).op for n in part.phase_order(pb.FORWARD)][-1] == "remat.context_forward"
    peak = ir.store_all(part).predicted_peak_bytes
    assert peak == 10**6 + 3000   # the context, a3 (the output), a2 (saved), g3 (made)
    planned = solvers.solve(part, peak - 1000, "checkmate")
    sequences = compute_sequences(planned, forward, backward)
    assert sequences == (forward, [ids["f2"], ids["b3"], ids["b2"]])
    shape = PartShape(tg, forward, backward)
    assert shape.base_options()[0].saved == 1000
    assert shape.measure(*sequences).saved == 0
    assert min(o.saved for o in leaf_options(shape, ["checkmate"], 10, Deadline(30), "x")) == 0


@search(40)
@given(graph=training_graphs(), max_cluster=st.integers(2, 4))
def test_random_clusters_cut_out_are_valid_graphs_and_their_plans_options(graph, max_cluster):
    for tg, forward, backward in leaf_clusters(graph, max_cluster=max_cluster, max_top=2):
        part = part_graph(graph, forward, backward, "leaf")   # validates, or raises
        reference = ir.store_all(part)
        least = ir.recompute_all(part)
        assert ir.simulate(part, least).valid
        shape = PartShape(tg, forward, backward)
        for schedule in (reference, least):
            sequences = compute_sequences(schedule, forward, backward)
            assert sequences is not None
            option = shape.measure(*sequences)
            assert option.forward == tuple(sequences[0])
            assert sorted(set(option.backward) - set(forward)) == sorted(backward)


def test_checkmate_leaf_options_add_trade_offs_on_gpt2_blocks(gpt2_graph):
    """Checkmate on a GPT-2 leaf cluster: its plans at the budget grid are options that
    keep less than storing everything, and every one runs the cluster's forward once."""
    found = 0
    for tg, forward, backward in leaf_clusters(gpt2_graph, max_cluster=20, max_top=30):
        shape = PartShape(tg, forward, backward)
        store = shape.base_options()[0]
        if len(forward) < 6 or not store.saved:
            continue
        options = leaf_options(shape, ["checkmate"], 5.0, Deadline(60), "leaf")
        assert options, "checkmate planned the cluster at some budget of the grid"
        for option in options:
            assert sorted(option.forward) == sorted(forward)
            assert set(backward) <= set(option.backward)
        assert min(o.saved for o in options) < store.saved
        found += 1
        if found == 2:
            break
    assert found == 2


@search(15)
@given(graph=training_graphs(), share=st.floats(0.2, 1.0))
def test_hiremate_with_leaf_solvers_is_valid_within_budget(graph, share):
    budget = max(1, int(ir.store_all(graph).predicted_peak_bytes * share))
    options = dict(time_limit_s=20, leaf_solvers="checkmate,rotor", max_cluster=3, max_top=2)
    try:
        schedule = solvers.solve(graph, budget, "hiremate", **options)
    except solvers.InfeasibleBudget as refused:
        retry = solvers.solve(graph, refused.smallest_feasible, "hiremate", **options)
        assert retry.predicted_peak_bytes <= refused.smallest_feasible
        return
    result = ir.simulate(graph, schedule)
    assert result.valid and result.peak_bytes <= budget
    assert schedule.solver_params["leaf_solvers"] == "checkmate,rotor"


def test_leaf_solver_names_are_checked_up_front():
    assert leaf_solver_names("checkmate, rotor,checkmate") == ("checkmate", "rotor")
    assert leaf_solver_names(["rotor"]) == ("rotor",)
    assert leaf_solver_names("") == ()
    with pytest.raises(UnknownSolver, match="unknown solver 'rotr'"):
        leaf_solver_names("rotr")
    with pytest.raises(BadRequest, match="leaf_solvers must be solver names, e.g. 'checkmate,rotor'; got 3"):
        leaf_solver_names(3)
    with pytest.raises(BadRequest, match="leaf_solvers cannot name hiremate itself"):
        leaf_solver_names("hiremate")
    graph, _ = chain(4)
    with pytest.raises(UnknownSolver, match="unknown solver 'nope'"):
        solvers.solve(graph, "50%", "hiremate", leaf_solvers="nope")


def test_a_failing_leaf_solver_is_named_and_the_plan_goes_on(tmp_path):
    """An `exec:` leaf solver that crashes: hiremate says so in its progress and plans
    with its other options. Once: it was asked again, and said so again, on every
    cluster (three here)."""
    runs = tmp_path / "runs"
    crash = tmp_path / "crash.sh"
    crash.write_text(f"#!/bin/sh\necho run >> {runs}\necho broken >&2\nexit 1\n")
    crash.chmod(0o755)
    graph, _ = chain(12)
    messages = []
    schedule = solvers.solve(graph, "50%", "hiremate", time_limit_s=20, max_cluster=4, max_top=3,
                             leaf_solvers=f"exec:{crash}", progress=messages.append)
    assert ir.simulate(graph, schedule).valid
    failed = [m for m in messages if "leaf solver" in m and "failed" in m]
    assert len(failed) == 1 and "broken" in failed[0], messages
    assert "is not asked again (the clusters plan with their other options)" in failed[0]
    assert runs.read_text() == "run\n"
    assert sum("options; " in m for m in messages) >= 3  # the other clusters planned on


def test_a_leaf_solver_that_cannot_start_is_refused_up_front(tmp_path):
    """A missing or unexecutable `exec:` program in `leaf_solvers` failed on every cluster,
    each time said in the progress, while hiremate planned on: it is one error, before
    planning, in the words `solve` uses for the program as a solver of its own."""
    missing = tmp_path / "no-such-solver"
    with pytest.raises(solvers.SolverError) as raised:
        leaf_solver_names(f"rotor,exec:{missing} --fast")
    assert str(raised.value) == (f"leaf_solvers 'exec:{missing} --fast': external solver "
                                 f"'{missing} --fast': cannot run '{missing}': there is no such file")
    plain = tmp_path / "solver.sh"
    plain.write_text("#!/bin/sh\nexit 1\n")
    plain.chmod(0o644)
    with pytest.raises(solvers.SolverError, match=f"cannot run '{plain}': it is not executable"):
        leaf_solver_names(f"exec:{plain}")
    graph, _ = chain(12)
    messages = []
    with pytest.raises(solvers.SolverError, match="leaf_solvers 'exec:remat-no-such-leaf-solver'"
                                                  ": .* it is not a file and not found on PATH"):
        solvers.solve(graph, "50%", "hiremate", max_cluster=4, max_top=3,
                      leaf_solvers="exec:remat-no-such-leaf-solver", progress=messages.append)
    assert messages == []  # refused before any cluster was planned


def test_cli_takes_leaf_solvers_as_an_option(tmp_path):
    import subprocess
    import sys
    graph, _ = chain(10)
    path = ir.save(graph, tmp_path / "chain.rir")

    def run(option):
        return subprocess.run([sys.executable, "-m", "remat_ir", "solve", str(path), "--budget", "50%",
                               "--option", "max_cluster=3", "--option", option,
                               "-o", str(tmp_path / "out.rir")], capture_output=True, text=True)

    done = run("leaf_solvers=checkmate,rotor")
    assert done.returncode == 0, done.stderr
    planned = ir.load(tmp_path / "out.rir").schedules[-1]
    assert planned.solver_params["leaf_solvers"] == "checkmate,rotor"
    assert ir.simulate(graph, planned).peak_bytes <= ir.store_all(graph).predicted_peak_bytes // 2
    done = run("leaf_solvers=rotr")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "remat-ir: error: unknown solver 'rotr'" in done.stderr
