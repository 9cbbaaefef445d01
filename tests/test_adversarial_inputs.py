"""Inputs that break the rules on purpose: a plugin that edits the graph it is handed,
node flags and outputs edited in a file, schedules naming unknown nodes, external
programs that misbehave. Each was found by a review; each test fails without its fix.
"""

from __future__ import annotations

import shlex
import sys
import textwrap
import time
from pathlib import Path

import pytest

from remat_ir import ir, solvers
from remat_ir.ir import pb
from remat_ir.ir.arguments import DTypeArg
from remat_ir.ir.examples import mlp
from remat_ir.ir.gradient_sums import cast_backs
from remat_ir.solvers import SolverError

# ---------------------------------------------------------------- plugins

EDITING_PLUGIN = '''
"""Solvers that misbehave inside the process."""

from remat_ir.ir import pb, store_all


def edits(graph, budget, *, time_limit_s=None, progress=None):
    """Drops a parameter's gradient output and renames a node of the graph it is given."""
    victim = next(o for o in graph.proto.outputs if o.role == pb.PARAMETER_GRADIENT)
    graph.proto.outputs.remove(victim)
    graph.proto.nodes[0].name = "edited"
    return store_all(graph)


def raises(graph, budget, *, time_limit_s=None, progress=None):
    """Fails with an error of its own."""
    raise KeyError("oops")
'''


@pytest.fixture
def editing_plugin(tmp_path, monkeypatch):
    """`editing_plugin` installed as a distribution in a folder on sys.path."""
    folder = tmp_path / "site"
    info = folder / "editing_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (folder / "editing_plugin.py").write_text(EDITING_PLUGIN)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: editing_plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[remat_ir.solvers]\nadv-edits = editing_plugin:edits\n"
                                           "adv-raises = editing_plugin:raises\n")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "editing_plugin", raising=False)
    yield folder
    sys.modules.pop("editing_plugin", None)


def test_a_plugin_cannot_edit_the_callers_graph(editing_plugin):
    graph = mlp(layers=2, batch=4, width=8)
    before = pb.Graph()
    before.CopyFrom(graph.proto)
    # Its plan, made on its copy, frees the dropped output: replayed on the caller's graph,
    # where that output is still one, it is refused, and the graph is as it was.
    with pytest.raises(SolverError, match=r"step 16: free of graph output value "
                                          r"'grad_weight_1' \(id 17\)"):
        solvers.solve(graph, None, "adv-edits")
    assert len(graph.proto.outputs) == len(before.outputs) == 5
    assert graph.proto.nodes[0].name == before.nodes[0].name != "edited"
    assert graph.proto == before

def test_an_error_inside_a_plugin_names_the_plugin(editing_plugin):
    with pytest.raises(SolverError) as failed:
        solvers.solve(mlp(layers=2, batch=4, width=8), None, "adv-raises")
    assert str(failed.value) == ("plugin solver 'adv-raises' failed: KeyError: 'oops' (raised "
                                 "inside plugin (editing_plugin): report it to its authors, or "
                                 "plan with another solver)")
    assert isinstance(failed.value.__cause__, KeyError)


# ---------------------------------------------------------------- node flags


def _weight_gradient_graph(op: str, kwargs: dict | None = None) -> tuple[ir.Graph, int]:
    """A parameter `w` whose gradient output a backward node `op` makes from the loss's
    gradient: (graph, that node)."""
    g = ir.Graph(name="flags")
    w = g.add_value("w", "float32", (3, 3), kind="parameter")
    g.add_input(w)
    loss = g.add_value("loss", "float32", (3, 3), kind="output")
    g.add_node("aten.clone.default", [w], [loss], phase="forward")
    g.add_output(loss, "user_output", "loss")
    tangent = g.add_value("tangent", "float32", (3, 3), kind="gradient")
    g.add_input(tangent, gradient_of=loss)
    grad = g.add_value("grad_w", "float32", (3, 3), kind="gradient")
    back = g.add_node(op, [tangent], [grad], phase="backward", kwargs=kwargs)
    g.add_output(grad, "parameter_gradient", "w")
    return g, back


def test_a_cast_back_mark_on_an_op_that_is_no_cast_is_refused():
    graph, back = _weight_gradient_graph("aten.t.default")
    graph.node(back).autocast_cast_back = True
    assert ir.validation.find_problems(graph) == [
        "node 't_1' (aten.t.default, id 1) is marked autocast_cast_back, but only a cast of one "
        "tensor to another dtype (aten._to_copy.default with a dtype argument) can be one: the "
        "runtime would hand autograd its input in place of its result; clear the mark (the "
        "torch frontend sets it on autocast's casts back only)"]
    assert cast_backs(graph) == {}   # nor is it handed over as one where not validated
    cast, back = _weight_gradient_graph("aten._to_copy.default", {"dtype": DTypeArg("float32")})
    cast.node(back).autocast_cast_back = True
    assert ir.validation.find_problems(cast) == []
    assert cast_backs(cast) == {cast.proto.outputs[-1].value_id: back}


def test_a_shape_only_mark_on_an_op_drawing_from_values_is_refused():
    pytest.importorskip("torch")
    from remat_ir.runtimes.op_checks import UnsupportedOp, checked_op
    g = ir.Graph(name="draws")
    x = g.add_value("x", "float32", (4,), kind="user_input")
    g.add_input(x)
    drawn = {op: g.add_value(op, "float32", (4,)) for op in ("poisson", "rand_like")}
    nodes = {op: g.add_node(f"aten.{op}.default", [x], [v], phase="forward", random=True,
                            rng_shape_only=True) for op, v in drawn.items()}
    checked_op(g, nodes["rand_like"])
    with pytest.raises(UnsupportedOp) as refused:
        checked_op(g, nodes["poisson"])
    assert str(refused.value) == (
        "node 'poisson_0' (aten.poisson.default, id 0) is marked rng_shape_only in the graph "
        "(Node.rng_shape_only), but the draws of aten.poisson.default are not known to depend "
        "on shapes alone, so the runtime may not skip it: lower the model again (the torch "
        "frontend marks the ops whose draws do)")


# ---------------------------------------------------------------- outputs removed


def test_a_torch_graph_with_a_gradient_output_removed_is_refused():
    graph, _ = _weight_gradient_graph("aten.t.default")
    graph.proto.provenance.frontend = "torch"
    assert ir.validation.find_problems(graph) == []
    del graph.proto.outputs[-1]   # the gradient of `w`: its `.grad` stayed None
    assert ir.validation.find_problems(graph) == [
        "node 't_1' (aten.t.default, id 1) computes 'grad_w', which no node reads and no graph "
        "output names; a graph from the torch frontend has no such node, so a graph output was "
        "removed from it (a parameter's gradient, a buffer's update): lower the model again"]
    # A graph built by hand may compute what it does not use.
    graph.proto.provenance.frontend = ""
    assert ir.validation.find_problems(graph) == []


# ---------------------------------------------------------------- schedules


def _graph_with_a_buffer() -> ir.Graph:
    """A buffer `b` read by the forward and the backward, and updated by the step."""
    g = ir.Graph(name="buffer")
    x = g.add_value("x", "float32", (4,), kind="user_input")
    g.add_input(x)
    b = g.add_value("b", "float32", (4,), kind="buffer")
    g.add_input(b)
    y = g.add_value("y", "float32", (4,), kind="output")
    g.add_node("test.f", [x, b], [y], phase="forward")
    g.add_output(y, "user_output", "y")
    new = g.add_value("new_b", "float32", (4,))
    g.add_node("test.u", [b], [new], phase="forward")
    g.add_output(new, "buffer_update", "b")
    tangent = g.add_value("tangent", "float32", (4,), kind="gradient")
    g.add_input(tangent, gradient_of=y)
    gx = g.add_value("gx", "float32", (4,), kind="gradient")
    g.add_node("test.b", [tangent, b], [gx], phase="backward")
    g.add_output(gx, "input_gradient", "x")
    return g


def test_an_unknown_node_in_the_backward_is_a_bad_step_not_a_key_error():
    graph = _graph_with_a_buffer()
    schedule = ir.store_all(graph)
    schedule.steps.add(compute=1000000)   # after the backward's steps
    result = ir.simulate(graph, schedule)
    assert not result.valid
    assert str(result.violation) == f"step {len(schedule.steps) - 1}: compute of node id 1000000, which does not exist"


# ---------------------------------------------------------------- external programs


def _script(tmp_path: Path, name: str, body: str) -> str:
    """`exec:` name of a Python script run by this interpreter."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return f"exec:{shlex.quote(sys.executable)} {shlex.quote(str(path))}"


def test_a_schedule_printed_before_a_child_holds_stdout_is_taken_at_once(tmp_path):
    graph = mlp(layers=2, batch=4, width=8)
    plan = ir.store_all(graph).SerializeToString()
    name = _script(tmp_path, "daemon", f"""
        import os, sys, time
        sys.stdin.buffer.read()
        sys.stdout.buffer.write({plan!r})
        sys.stdout.flush()
        if os.fork() == 0:   # a child of its own session holding stdout and stderr
            os.setsid()
            time.sleep(6)
            os._exit(0)
    """)
    started = time.monotonic()
    schedule = solvers.solve(graph, None, name, time_limit_s=4)
    assert time.monotonic() - started < 3   # was: the time limit and grace, then "printed nothing"
    assert schedule.predicted_peak_bytes == ir.store_all(graph).predicted_peak_bytes


def test_a_floor_no_graph_of_this_size_could_need_is_refused(tmp_path):
    graph = mlp(layers=2, batch=4, width=8)
    answer = pb.Schedule(predicted_peak_bytes=2**64 - 1).SerializeToString()
    name = _script(tmp_path, "huge", f"""
        import sys
        sys.stdin.buffer.read()
        sys.stdout.buffer.write({answer!r})
        sys.exit(3)
    """)
    with pytest.raises(SolverError) as refused:
        solvers.solve(graph, 100, name)
    assert str(refused.value) == (
        f"external solver {name[5:]!r} exited with status 3 (no schedule fits the budget of 100 "
        f"bytes) and names 18,446,744,073,709,551,615 bytes as the smallest feasible one, more "
        f"than any schedule of this graph can hold (4,944 bytes: all its 21 storages twice over "
        f"and every workspace): not a peak; it must name the peak of a schedule it found, or "
        f"print nothing. It wrote nothing on stderr.")


def _offloading(graph: ir.Graph) -> pb.Schedule:
    """store_all's schedule with one activation offloaded (and freed) after its last
    forward use and prefetched before its first backward one: the first such the
    simulator takes."""
    from remat_ir.ir.simulator import simulate

    plan = ir.store_all(graph)
    steps = list(plan.steps)
    computed = [k for k, step in enumerate(steps) if step.WhichOneof("action") == "compute"]
    for k in computed:
        for value in graph.node(steps[k].compute).outputs:
            uses = [j for j in computed if value in graph.node(steps[j].compute).inputs]
            forward = [j for j in uses if j < plan.backward_start]
            backward = [j for j in uses if j >= plan.backward_start]
            if not backward:
                continue
            after, before = (forward[-1] if forward else k) + 1, backward[0]
            trial = pb.Schedule()
            trial.CopyFrom(plan)
            del trial.steps[:]
            trial.steps.extend([*steps[:after], pb.Step(offload=value), pb.Step(free=value),
                                *steps[after:before], pb.Step(prefetch=value), *steps[before:]])
            trial.backward_start = plan.backward_start + 2
            result = simulate(graph, trial)
            if result.valid and result.transferred_bytes:
                return trial
    raise AssertionError("no activation could be offloaded")


def test_an_offloading_schedule_for_a_graph_without_a_host_link_is_refused(tmp_path):
    """Found by a review: an external solver's offloads on a graph that describes no host
    link were accepted and timed at nothing (`0 us of transfers`), where `--offload`
    refuses such a graph."""
    graph = mlp(layers=2, batch=4, width=8)
    offloaded = _offloading(graph)
    name = _script(tmp_path, "offloads", f"""
        import sys
        sys.stdin.buffer.read()
        sys.stdout.buffer.write({offloaded.SerializeToString()!r})
    """)
    with pytest.raises(SolverError, match=r"returned a schedule that offloads to host memory, and this graph "
                                          r"describes no host link to time its transfers: give one"):
        solvers.solve(graph, None, name)


def test_a_nodes_arguments_that_its_op_cannot_take_are_named_before_any_code_runs():
    """Found by hunt68: arguments edited in a file (a keyword renamed, a tensor given where
    the op takes a number, one too many) raised torch's own error from inside the
    generated step, naming no node."""
    torch = pytest.importorskip("torch")
    from remat_ir.lowering import lower_torch
    from remat_ir.runtimes.op_checks import op_problems

    torch.manual_seed(0)
    graph = lower_torch(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()), (torch.randn(2, 4),),
                        cost_model="flops")
    assert op_problems(graph) == []
    tanh = next(n for n in graph.proto.nodes if n.op == "aten.tanh.default")
    tanh.kwargs.add(name="bogus").value.int_value = 1
    (problem,) = op_problems(graph)
    assert problem.startswith(f"node '{tanh.name}' (aten.tanh.default, id {tanh.id}) gives argument 'bogus', "
                              "which the op has not, where aten.tanh.default is `aten::tanh(Tensor self) -> "
                              "Tensor`: the graph was not written for this op")
    del tanh.kwargs[:]
    tanh.args.add().int_value = 3
    (problem,) = op_problems(graph)
    assert "gives 2 positional arguments, more than the op's 1" in problem
