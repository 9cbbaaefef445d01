"""Structural validation names each problem and where it is."""

import pytest

from remat_ir import ir
from remat_ir.ir import pb
from builders import chain


def problems_after(mutate) -> list[str]:
    g, ids = chain(3)
    proto = pb.Graph()
    proto.CopyFrom(g.proto)
    mutate(proto, ids)
    return ir.find_problems(proto)


def test_valid_chain_has_no_problems():
    g, _ = chain(3)
    assert ir.find_problems(g) == []
    assert ir.validate(g.proto).topological_order == g.topological_order


def node(proto, node_id):
    return next(n for n in proto.nodes if n.id == node_id)


def read(proto, node_id, value_id):
    """Make a node also read a value (as an input and a positional argument)."""
    n = node(proto, node_id)
    n.inputs.append(value_id)
    n.args.add(tensor=value_id)


def value(proto, value_id):
    return next(v for v in proto.values if v.id == value_id)


def test_cycle_is_reported_with_its_nodes():
    def make_cycle(proto, ids):  # f1 now also reads a2, which f2 computes from a1
        read(proto, ids["f1"], ids["a2"])
    (problem,) = problems_after(make_cycle)
    f1, f2 = "node 'f_0' (test.f, id 0)", "node 'f_1' (test.f, id 1)"
    assert problem in (f"the graph has a cycle: {f1} -> {f2} -> {f1}",
                       f"the graph has a cycle: {f2} -> {f1} -> {f2}")


def test_dangling_value_id():
    def dangle(proto, ids):
        read(proto, ids["b2"], 4242)
    assert problems_after(dangle) == [
        "node 'b_4' (test.b, id 4) has input value id 4242, which does not exist"]


def test_duplicate_ids():
    def duplicate(proto, ids):
        proto.nodes.add().CopyFrom(node(proto, ids["f1"]))
    assert problems_after(duplicate) == ["node id 0 is used more than once; ids must be unique"]


def test_bytes_must_match_shape_and_dtype():
    def wrong_size(proto, ids):
        value(proto, ids["a1"]).size_bytes = 7
    (problem,) = problems_after(wrong_size)
    assert problem == "value 'a1' (id 1) says 7 bytes but shape [250] of float32 is 1000 bytes"


def test_alias_of_missing_storage():
    def bad_alias(proto, ids):
        value(proto, ids["a2"]).storage_id = 999
    assert problems_after(bad_alias) == ["value 'a2' (id 2) aliases storage 999, which does not exist"]


def test_a_storage_must_hold_the_values_it_stores():
    """A storage smaller than its values (a file edited: cut by 8) was simulated within a
    budget the run then exceeded (found by a review); strides and offsets count."""
    def shrink(proto, ids):
        storage = next(s for s in proto.storages if s.id == value(proto, ids["a1"]).storage_id)
        storage.size_bytes //= 8
    (problem,) = problems_after(shrink)
    assert problem == ("value 'a1' (id 1) reaches 1000 bytes into storage 1 (shape [250], strides "
                       "contiguous, offset 0), which holds 125 bytes")

    def stride_past_the_end(proto, ids):   # every other element: 499 elements' reach
        v = value(proto, ids["a1"])
        v.stride.append(2)
    (problem,) = problems_after(stride_past_the_end)
    assert problem.startswith("value 'a1' (id 1) reaches 1996 bytes into storage 1 (shape [250], strides [2]")

    def offset_view(proto, ids):   # the last 125 elements of 250: within
        v = value(proto, ids["a1"])
        del v.shape[:]
        v.shape.append(125)
        v.size_bytes, v.storage_offset = 500, 125
    assert problems_after(offset_view) == []


def test_value_read_but_never_computed():
    def orphan(proto, ids):
        proto.values.add(id=100, name="ghost", dtype=pb.FLOAT32, shape=[1], size_bytes=4,
                         kind=pb.ACTIVATION, storage_id=0)
        read(proto, ids["f2"], 100)
    (problem,) = problems_after(orphan)
    assert "reads value 'ghost' (id 100), which no node computes and which is not a graph input" in problem


def test_value_computed_twice():
    def twice(proto, ids):
        node(proto, ids["f2"]).outputs.append(ids["a1"])
    assert any("value id 1 is produced by both" in p for p in problems_after(twice))


def test_forward_may_not_depend_on_backward():
    def backwards(proto, ids):
        read(proto, ids["f3"], ids["g2"])
    assert problems_after(backwards) == [
        "forward node 'f_2' (test.f, id 2) depends on backward node 'b_3' (test.b, id 3) through 'g2'"]


def test_arguments_must_match_inputs():
    g = _two_user_inputs(args=[ir.TensorRef(0), 2])
    (problem,) = ir.find_problems(g)
    assert "the values its arguments refer to [0] are not its inputs [0, 1]" in problem


def test_op_needs_a_namespace_and_nodes_a_phase():
    def unnamespaced(proto, ids):
        node(proto, ids["f1"]).op = "mm"
        node(proto, ids["f2"]).phase = pb.PHASE_UNSPECIFIED
    problems = problems_after(unnamespaced)
    assert any("has op 'mm' without a namespace" in p for p in problems)
    assert any("has no phase" in p for p in problems)


def test_schedule_references_are_checked():
    def bad_schedule(proto, ids):
        s = proto.schedules.add(name="s", backward_start=5)
        s.steps.add(compute=77)
        s.steps.add(free=88)
        s.steps.add()
    problems = problems_after(bad_schedule)
    assert "schedule 's' starts backward at step 5 but has only 3 steps" in problems
    assert "schedule 's' step 0 computes node id 77, which does not exist" in problems
    assert "schedule 's' step 1 frees value id 88, which does not exist" in problems
    assert "schedule 's' step 2 has no action" in problems


def test_hierarchy_references_are_checked():
    def bad_hierarchy(proto, ids):
        proto.hierarchy.clusters.add(id=0, name="leaf", level=0, node_ids=[1234])
        proto.hierarchy.clusters.add(id=1, name="top", level=0, children=[0, 9])
        proto.hierarchy.root_id = 5
    problems = problems_after(bad_hierarchy)
    assert "cluster 'leaf' (id 0) contains node id 1234, which does not exist" in problems
    assert "cluster 'top' (id 1) has child cluster id 9, which does not exist" in problems
    assert any("children must be at lower levels" in p for p in problems)
    assert "hierarchy root is cluster id 5, which does not exist" in problems


def test_invalid_graph_error_lists_all_problems():
    g, ids = chain(2)
    g.proto.values[1].size_bytes = 1
    g.proto.values[2].size_bytes = 2
    with pytest.raises(ir.InvalidGraph) as info:
        ir.validate(g.proto)
    assert len(info.value.problems) == 2
    assert "(and 1 more problems)" in str(info.value)


def _two_user_inputs(args=None) -> ir.Graph:
    """x + y = out, x and y user inputs; `args`: the add node's arguments (default: its inputs)."""
    g = ir.Graph()
    x = g.add_value("x", "float32", (2,), kind="user_input")
    y = g.add_value("y", "float32", (2,), kind="user_input")
    g.add_input(x)
    g.add_input(y)
    out = g.add_value("out", "float32", (2,), kind="output")
    g.add_node("aten.add.Tensor", [x, y], [out], phase="forward", args=args)
    g.add_output(out, "user_output")
    return g


def test_user_inputs_take_positions_in_the_order_they_are_added():
    g = _two_user_inputs()
    assert ir.find_problems(g) == []
    assert [(i.name, i.user_input_position) for i in g.user_inputs()] == [("x", 0), ("y", 1)]


def test_user_input_positions_must_be_present_and_unique():
    g = _two_user_inputs()
    g.proto.inputs[1].user_input_position = 0
    assert ir.find_problems(g) == [
        "user inputs 'x', 'y' all have user_input_position 0; each position is one argument "
        "of the caller, so give each its own"]
    g.proto.inputs[0].ClearField("user_input_position")
    assert ir.find_problems(g) == [
        "user input 'x' (value id 0) has no user_input_position; set it to where the caller "
        "passes this tensor among its flattened arguments (Graph.add_input(..., position=...))"]
    with pytest.raises(ir.InvalidGraph, match="no user_input_position"):
        ir.validate(g)


def test_only_user_inputs_take_a_position():
    g, ids = chain(3)
    parameter = g.add_value("w", "float32", (2,), kind="parameter")
    with pytest.raises(ValueError, match="'w' is not a user input"):
        g.add_input(parameter, position=3)
    gradient = next(i for i in g.proto.inputs if g.value(i.value_id).kind == pb.GRADIENT)
    gradient.user_input_position = 1
    (problem,) = ir.find_problems(g)
    assert "is a gradient, not a user input, but has a user_input_position" in problem


@pytest.mark.parametrize("where", ["time_s", "flops", "host_s", "device_s", "step_overhead_s",
                                   "bandwidth_bytes_per_s"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_times_and_rates_must_be_finite_and_not_negative(where, bad):
    """A NaN node time passed the old `< 0` check: hiremate then crashed in its MILP solver
    (a segmentation fault), rotor called a feasible budget infeasible."""
    def spoil(proto, ids):
        if where in ("step_overhead_s",):
            setattr(proto.provenance.cost_model, where, bad)
        elif where == "bandwidth_bytes_per_s":
            setattr(proto.provenance.host_link, where, bad)
        else:
            setattr(node(proto, ids["f1"]).cost, where, bad)
    (problem,) = problems_after(spoil)
    assert f"has {where} = {bad}; it must be a finite number, 0 or more" in problem


def test_unknown_kinds_phases_and_roles_are_problems_not_crashes():
    """Found by hunt68: numbers no enum of the format has passed (a gradient output of
    role 42 trained with no gradient, silently), or crashed `inspect` naming nothing."""
    def spoil(proto, ids):
        value(proto, ids["a1"]).kind = 99
        node(proto, ids["f2"]).phase = 7
        proto.outputs[0].role = 42
    problems = problems_after(spoil)
    assert any("value 'a1' (id 1) has kind 99, which no ValueKind of this format is" in p for p in problems)
    assert any("has phase 7, which is neither forward (1) nor backward (2)" in p for p in problems)
    assert any("graph output 'out' (value id 3) has role 42, which no OutputRole of this format is" in p
               for p in problems)


class _NormedMLP:
    """A linear layer, a batch norm (its running statistics are buffer updates), a head."""

    @staticmethod
    def lowered() -> pb.Graph:
        import torch

        from remat_ir.lowering import lower_torch

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1))
        return lower_torch(model, (torch.randn(6, 4),), cost_model="flops").proto


@pytest.fixture(scope="module")
def normed_mlp() -> pb.Graph:
    return _NormedMLP.lowered()


def _named(proto: pb.Graph, role: int, name: str) -> pb.GraphOutput:
    return next(o for o in proto.outputs if o.role == role and o.name == name)


@pytest.mark.parametrize("edit, said", [
    (lambda g: setattr(_named(g, pb.PARAMETER_GRADIENT, "0.weight"), "name", "2.weight"),
     r"graph outputs \(value ids \d+ and \d+\) are both the parameter gradient of '2.weight'"),
    (lambda g: setattr(_named(g, pb.PARAMETER_GRADIENT, "0.weight"), "name", "zzz"),
     r"graph output 'zzz' \(value id \d+\) is a parameter gradient, but no parameter among the inputs is "
     r"named 'zzz'"),
    (lambda g: setattr(_named(g, pb.PARAMETER_GRADIENT, "0.weight"), "name", "1.running_mean"),
     r"is a parameter gradient, but no parameter among the inputs is named '1.running_mean'"),
    (lambda g: setattr(_named(g, pb.BUFFER_UPDATE, "1.running_mean"), "name", "2.weight"),
     r"graph output '2.weight' \(value id \d+\) is a buffer update of shape \[4\] float32, but the input it "
     r"names is \[1, 4\] float32"),
    (lambda g: setattr(_named(g, pb.BUFFER_UPDATE, "1.running_mean"), "name", "zzz"),
     r"is a buffer update, but no buffer or parameter or user input among the inputs is named 'zzz'"),
    (lambda g: setattr(next(i for i in g.inputs if i.name == "2.weight"), "name", "0.weight"),
     r"graph inputs \(value ids \d+, \d+\) are all named '0.weight'; a parameter's or buffer's name binds it"),
    (lambda g: setattr(next(i for i in g.inputs if i.HasField("gradient_of")), "gradient_of",
                       _named(g, pb.PARAMETER_GRADIENT, "0.weight").value_id),
     r"graph input 'grad_output0' is the gradient of value id \d+, which no user output returns"),
])
def test_what_a_runtime_binds_by_name_names_one_input_of_its_kind(normed_mlp, edit, said):
    """Found by hunt68, silent in a torch graph edited by hand: a gradient output named
    for another parameter (that one trained with the wrong gradient, 0.05 off, and this
    one with none), for nothing or for a buffer (no gradient); a buffer's new value named
    for a parameter of another shape (written into it at every call: one of its shape
    cannot be told from a weight the forward decays in place); two parameters of one name
    (said to be tied at the call); a tangent made the gradient of a parameter's gradient
    (a raw autograd error at the first backward: F16)."""
    import re

    assert ir.find_problems(normed_mlp) == []
    proto = pb.Graph()
    proto.CopyFrom(normed_mlp)
    edit(proto)
    assert any(re.search(said, problem) for problem in ir.find_problems(proto)), ir.find_problems(proto)


def test_a_torch_graph_keeps_no_op_only_a_trace_time_check_reads():
    """Found by hunt68 (BART, LongT5, LiLT): ops whose results only export's dtype checks
    read, or nothing does, stayed in the graph as nodes no one reads, which validation
    takes for a file with an output removed: the graph, saved, could not be loaded."""
    import torch

    from remat_ir.lowering import lower_torch

    class _Unread(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            torch.ones(x.shape[0], 4).to(x.dtype)   # read by export's check alone
            x.max(dim=-1)                          # results never taken
            return self.fc(x).square().mean()

    graph = lower_torch(_Unread(), (torch.randn(3, 4),), cost_model="flops")
    assert ir.find_problems(graph) == []
    assert ir.find_problems(ir.loads(ir.dumps(graph))) == []


def test_a_value_returned_twice_has_a_tangent_per_output():
    """`return h, h`: two user outputs of one value, each with its tangent; valid."""
    import torch

    from remat_ir.lowering import lower_torch

    class _Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = self.fc(x).tanh()
            return h, h, h.sum()

    graph = lower_torch(_Twice(), (torch.randn(2, 4),), cost_model="flops")
    tangents = [i.gradient_of for i in graph.proto.inputs if i.HasField("gradient_of")]
    assert len(tangents) == 3 and len(set(tangents)) == 2
    assert ir.find_problems(graph) == []
