"""Structural validation: every rule a graph must satisfy before anyone trusts it.

Works on the raw protobuf message, so it can describe graphs too broken to
index (duplicate ids, dangling references). Each problem is one sentence that
names the object (by name and id) and says what to fix. Schedules are checked
here only for references; whether they are *valid* is the simulator's job.
"""

from __future__ import annotations

import math
from collections import Counter

import networkx as nx

from . import remat_ir_pb2 as pb
from .dtypes import ITEMSIZE, dtype_name, nbytes
from .errors import InvalidGraph
from .frontend_metadata import metadata_problems
from .fusion import body_problems
from .gradient_sums import CAST_BACK_OP, is_cast_back
from .graph import FORWARD_OUTPUT_ROLES, FORMAT_VERSION, RESIDENT_KINDS, Graph, referenced_value_ids

#: Value kinds that a graph input may have.
INPUT_KINDS = RESIDENT_KINDS - {pb.CONSTANT}


def _duplicates(ids) -> list[int]:
    return sorted(i for i, c in Counter(ids).items() if c > 1)


def _node_label(node: pb.Node) -> str:
    return f"node {node.name!r} ({node.op}, id {node.id})"


def find_problems(graph: pb.Graph | Graph) -> list[str]:
    """Every structural problem of the graph, as sentences; empty when valid."""
    g = graph.proto if isinstance(graph, Graph) else graph
    problems: list[str] = []

    if g.version.major != FORMAT_VERSION[0]:
        problems.append(f"graph declares IR format major version {g.version.major}; "
                        f"this library handles {FORMAT_VERSION[0]}")

    for what, ids in (("value", [v.id for v in g.values]), ("node", [n.id for n in g.nodes]),
                      ("storage", [s.id for s in g.storages]),
                      ("cluster", [c.id for c in g.hierarchy.clusters])):
        for dup in _duplicates(ids):
            problems.append(f"{what} id {dup} is used more than once; ids must be unique")
    if problems:
        return problems  # everything below indexes by id

    values = {v.id: v for v in g.values}
    storages = {s.id: s for s in g.storages}
    problems += _value_problems(g, storages)
    problems += _node_problems(g, values)
    problems += _input_output_problems(g, values)
    if not problems:
        problems += _dependency_problems(g, values)
        problems += _unused_node_problems(g, values)
    problems += _hierarchy_problems(g)
    problems += _schedule_reference_problems(g, values)
    problems += _quantity_problems("the cost model", g.provenance.cost_model,
                                   ("step_overhead_s", "peak_byte_s", "call_overhead_s"))
    problems += _quantity_problems("the host link", g.provenance.host_link,
                                   ("bandwidth_bytes_per_s", "latency_s", "issue_s"))
    problems += metadata_problems(g.metadata, g.provenance.frontend)
    return problems


def validate(graph: pb.Graph | Graph) -> Graph:
    """Raise `InvalidGraph` listing every problem; return the graph as a `Graph`."""
    problems = find_problems(graph)
    if problems:
        raise InvalidGraph(problems)
    return graph if isinstance(graph, Graph) else Graph(graph)


#: `Graph.derived` keys: the graph was made by a frontend in this process (not read, built
#: or edited by hand), and the graph's structure was validated.
_MADE_HERE, _VALIDATED = "made by a frontend here", "validated"


def mark_made_here(graph: Graph) -> Graph:
    """Say that a frontend made `graph` in this process: `validate_once` takes it as it is
    (its structure is the frontend's, tested there; a change through `Graph` drops the mark)."""
    graph.derived[_MADE_HERE] = True
    return graph


def validate_once(graph: Graph) -> None:
    """`validate` a graph given to run (built or edited in memory: `ir.load` validates a
    file), once per structure; a graph a frontend made here is taken as it is."""
    if not (graph.derived.get(_MADE_HERE) or graph.derived.get(_VALIDATED)):
        validate(graph)
        graph.derived[_VALIDATED] = True


def _value_problems(g: pb.Graph, storages: dict) -> list[str]:
    problems = []
    for v in g.values:
        label = f"value {v.name!r} (id {v.id})"
        if v.dtype not in ITEMSIZE:
            problems.append(f"{label} has no known dtype (enum {v.dtype})")
            continue
        if any(d < 0 for d in v.shape):
            problems.append(f"{label} has a negative dimension in shape {list(v.shape)}")
            continue
        expected = nbytes(v.dtype, v.shape)
        if v.size_bytes != expected:
            problems.append(f"{label} says {v.size_bytes} bytes but shape {list(v.shape)} of "
                            f"{dtype_name(v.dtype)} is {expected} bytes")
        if v.storage_id not in storages:
            problems.append(f"{label} aliases storage {v.storage_id}, which does not exist")
        elif (reach := _bytes_reached(v)) > storages[v.storage_id].size_bytes:
            # The simulator counts a storage's bytes: one smaller than its values (a file
            # cut by 8) was simulated within a budget the run exceeded (found by a review).
            problems.append(f"{label} reaches {reach} bytes into storage {v.storage_id} (shape "
                            f"{list(v.shape)}, strides {list(v.stride) or 'contiguous'}, offset "
                            f"{v.storage_offset}), which holds {storages[v.storage_id].size_bytes} bytes")
        if v.kind == pb.VALUE_KIND_UNSPECIFIED:
            problems.append(f"{label} has no kind")
        elif v.kind not in pb.ValueKind.values():
            problems.append(f"{label} has kind {v.kind}, which no ValueKind of this format is")
        if v.kind == pb.CONSTANT and len(v.constant.raw) != v.size_bytes:
            problems.append(f"{label} is a constant with {len(v.constant.raw)} bytes of data "
                            f"for a {v.size_bytes}-byte tensor")
    return problems


def _bytes_reached(v: pb.Value) -> int:
    """The bytes of its storage value `v` spans, from the start: to one past its last
    element at its offset and strides (contiguous ones where it records none)."""
    if any(d == 0 for d in v.shape):
        return 0
    strides = list(v.stride) or [math.prod(v.shape[i + 1:]) for i in range(len(v.shape))]
    last = v.storage_offset + sum((d - 1) * st for d, st in zip(v.shape, strides))
    return (last + 1) * ITEMSIZE[v.dtype]


def _node_problems(g: pb.Graph, values: dict) -> list[str]:
    problems = []
    produced_by: dict[int, pb.Node] = {}
    for n in g.nodes:
        label = _node_label(n)
        if "." not in n.op:
            problems.append(f"{label} has op {n.op!r} without a namespace "
                            "(expected e.g. 'aten.mm.default' or 'onnx.MatMul')")
        if n.phase == pb.PHASE_UNSPECIFIED:
            problems.append(f"{label} has no phase (forward or backward)")
        elif n.phase not in pb.Phase.values():
            problems.append(f"{label} has phase {n.phase}, which is neither forward (1) nor backward (2)")
        for role, ids in (("input", n.inputs), ("output", n.outputs)):
            for v in ids:
                if v not in values:
                    problems.append(f"{label} has {role} value id {v}, which does not exist")
        for v in n.outputs:
            if v in produced_by:
                problems.append(f"value id {v} is produced by both "
                                f"{_node_label(produced_by[v])} and {label}")
            produced_by[v] = n
            if v in values and values[v].kind in RESIDENT_KINDS - {pb.GRADIENT}:
                problems.append(f"{label} outputs {values[v].name!r} (id {v}), which is a "
                                f"{_kind(values[v].kind)} and cannot be computed")
        referenced = set(referenced_value_ids(n))
        if (n.args or n.kwargs) and referenced != set(n.inputs):
            problems.append(f"{label}: the values its arguments refer to {sorted(referenced)} "
                            f"are not its inputs {sorted(n.inputs)}")
        problems += _quantity_problems(label, n.cost, ("time_s", "flops", "host_s", "device_s"))
        problems += body_problems(n, label)
        if n.autocast_cast_back and not is_cast_back(n):
            problems.append(_cast_back_problem(n, label))
    return problems


def _cast_back_problem(n: pb.Node, label: str) -> str:
    """A node marked `autocast_cast_back` that is no cast: the runtime does not run it and
    hands autograd its input instead (`ir.gradient_sums.is_cast_back`, found by a review:
    an `aten.t` so marked left a weight's gradient transposed, no error)."""
    return (f"{label} is marked autocast_cast_back, but only a cast of one tensor to another "
            f"dtype ({CAST_BACK_OP} with a dtype argument) can be one: the runtime would hand "
            f"autograd its input in place of its result; clear the mark (the torch frontend "
            f"sets it on autocast's casts back only)")


def _quantity_problems(label: str, message, fields: tuple[str, ...]) -> list[str]:
    """Times, rates and counts must be finite and not negative: a NaN time passed the
    old `< 0` check, then `hiremate` crashed in its MILP solver (a segmentation fault)
    and `rotor` called a feasible budget infeasible."""
    problems = []
    for field in fields:
        x = getattr(message, field)
        if not math.isfinite(x) or x < 0:
            problems.append(f"{label} has {field} = {x}; it must be a finite number, 0 or more")
    return problems


def _input_output_problems(g: pb.Graph, values: dict) -> list[str]:
    problems = []
    produced = {v for n in g.nodes for v in n.outputs}
    inputs = {i.value_id for i in g.inputs}
    for i in g.inputs:
        if i.value_id not in values:
            problems.append(f"graph input {i.name!r} refers to value id {i.value_id}, which does not exist")
            continue
        v = values[i.value_id]
        if v.kind not in INPUT_KINDS:
            problems.append(f"graph input {i.name!r} (value id {v.id}) has kind "
                            f"{_kind(v.kind)}; inputs are user inputs, "
                            "parameters, buffers or output gradients")
        if i.value_id in produced:
            problems.append(f"graph input {i.name!r} (value id {v.id}) is also computed by a node")
        if i.HasField("gradient_of") and i.gradient_of not in values:
            problems.append(f"graph input {i.name!r} is the gradient of value id {i.gradient_of}, "
                            "which does not exist")
    problems += _user_input_position_problems(g, values)
    for n in g.nodes:
        for v in n.inputs:
            if v in values and v not in produced and v not in inputs and values[v].kind != pb.CONSTANT:
                problems.append(f"{_node_label(n)} reads value {values[v].name!r} (id {v}), which "
                                "no node computes and which is not a graph input")
    for o in g.outputs:
        if o.value_id not in values:
            problems.append(f"graph output {o.name!r} refers to value id {o.value_id}, which does not exist")
        elif o.value_id not in produced and o.value_id not in inputs:
            problems.append(f"graph output {o.name!r} (value id {o.value_id}) is never computed")
        if o.role == pb.OUTPUT_ROLE_UNSPECIFIED:
            problems.append(f"graph output {o.name!r} (value id {o.value_id}) has no role")
        elif o.role not in pb.OutputRole.values():
            problems.append(f"graph output {o.name!r} (value id {o.value_id}) has role {o.role}, "
                            "which no OutputRole of this format is")
    if g.provenance.frontend in _BOUND_FRONTENDS:
        problems += _binding_problems(g, values)
    return problems


#: Frontends whose graphs a runtime binds to a model by name (parameters, buffers, the
#: outputs naming them). Graphs made otherwise (a solver's part of a graph, a hand-made
#: one for planning alone) name their outputs as they like.
_BOUND_FRONTENDS = ("torch", "onnx")


#: The input kinds each output role names (`GraphOutput.name`): a runtime binds the output
#: to the input of that name. A forward writing in place into a parameter or an input
#: (a weight decayed in the forward) updates it as a buffer's new value.
_NAMED_INPUT = {pb.PARAMETER_GRADIENT: (pb.PARAMETER,), pb.INPUT_GRADIENT: (pb.USER_INPUT,),
                pb.BUFFER_UPDATE: (pb.BUFFER, pb.PARAMETER, pb.USER_INPUT)}


def _binding_problems(g: pb.Graph, values: dict) -> list[str]:
    """What a runtime binds by name binds one thing: parameters and buffers have names of
    their own, and a gradient or a buffer's new value names one input of its kind, once.
    Found by hunt68, all silent in a file edited by hand: two gradients named for one
    parameter (the other trained with none, and this one with the wrong one), a
    buffer's new value named for a parameter of another shape (written into it at every
    call; one of the same shape cannot be told from a weight the forward decays in place),
    two parameters of one name (said to be tied at the call)."""
    problems = []
    by_name: dict[str, list[pb.GraphInput]] = {}
    for i in g.inputs:
        if i.value_id in values and values[i.value_id].kind in (pb.PARAMETER, pb.BUFFER):
            by_name.setdefault(i.name, []).append(i)
    for name, found in sorted(by_name.items()):
        if len(found) > 1:
            problems.append(f"graph inputs (value ids {', '.join(str(i.value_id) for i in found)}) are all "
                            f"named {name!r}; a parameter's or buffer's name binds it to the model's "
                            "tensor, so give each its own")
    inputs = {i.name: values[i.value_id] for i in g.inputs if i.value_id in values}
    named: dict[tuple[int, str], int] = {}
    for o in g.outputs:
        wanted = _NAMED_INPUT.get(o.role)
        if wanted is None or o.value_id not in values:
            continue
        role = pb.OutputRole.Name(o.role).lower().replace("_", " ")
        target, value = inputs.get(o.name), values[o.value_id]
        if target is None or target.kind not in wanted:
            problems.append(f"graph output {o.name!r} (value id {o.value_id}) is a {role}, but no "
                            f"{' or '.join(_kind(k) for k in wanted)} among the inputs is named "
                            f"{o.name!r}; name the input it is for")
        elif o.role == pb.BUFFER_UPDATE and (list(target.shape) != list(value.shape) or target.dtype != value.dtype):
            problems.append(f"graph output {o.name!r} (value id {o.value_id}) is a buffer update of "
                            f"shape {list(value.shape)} {dtype_name(value.dtype)}, but the input it names "
                            f"is {list(target.shape)} {dtype_name(target.dtype)}")
        if (o.role, o.name) in named:
            problems.append(f"graph outputs (value ids {named[(o.role, o.name)]} and {o.value_id}) are "
                            f"both the {role} of {o.name!r}; each input has one")
        named.setdefault((o.role, o.name), o.value_id)
    # The runtime hands autograd's gradient of each user output to the tangent input
    # naming it: one naming another value met a raw autograd error at the first backward
    # (hunt68 F16: pointed at a parameter's gradient).
    # (A value returned twice, `return h, h`, has a tangent per output.)
    returned = {o.value_id for o in g.outputs if o.role == pb.USER_OUTPUT}
    for i in g.inputs:
        if i.HasField("gradient_of") and i.gradient_of in values and i.gradient_of not in returned:
            problems.append(f"graph input {i.name!r} is the gradient of value id {i.gradient_of}, which "
                            "no user output returns; a tangent is the gradient of a user output")
    return problems


def _kind(kind: int) -> str:
    """A value kind's name as messages say it ("parameter"), or its number where unknown."""
    return pb.ValueKind.Name(kind).lower().replace("_", " ") if kind in pb.ValueKind.values() else str(kind)


def _user_input_position_problems(g: pb.Graph, values: dict) -> list[str]:
    """Each user input says where the caller passes it (`user_input_position`), and no two
    say the same place: a runtime binds the caller's arguments by these positions alone."""
    problems = []
    by_position: dict[int, list[str]] = {}
    for i in g.inputs:
        v = values.get(i.value_id)
        if v is None:
            continue
        if v.kind == pb.USER_INPUT:
            if not i.HasField("user_input_position"):
                problems.append(f"user input {i.name!r} (value id {v.id}) has no user_input_position; "
                                "set it to where the caller passes this tensor among its flattened "
                                "arguments (Graph.add_input(..., position=...))")
            else:
                by_position.setdefault(i.user_input_position, []).append(repr(i.name))
        elif i.HasField("user_input_position") or i.argument_name:
            problems.append(f"graph input {i.name!r} (value id {v.id}) is a "
                            f"{_kind(v.kind)}, not a user input, but has a "
                            "user_input_position or argument_name; only user inputs take them")
    for position, names in sorted(by_position.items()):
        if len(names) > 1:
            problems.append(f"user inputs {', '.join(names)} all have user_input_position {position}; "
                            "each position is one argument of the caller, so give each its own")
    return problems


def _dependency_problems(g: pb.Graph, values: dict) -> list[str]:
    """Cycles, and forward work that depends on backward work."""
    graph = Graph(g)
    dag = graph.dependency_graph()
    try:
        cycle = nx.find_cycle(dag)
    except nx.NetworkXNoCycle:
        cycle = None
    if cycle:
        path = " -> ".join(graph.describe_node(u) for u, _ in cycle)
        return [f"the graph has a cycle: {path} -> {graph.describe_node(cycle[0][0])}"]
    problems = []
    for n in g.nodes:
        if n.phase != pb.FORWARD:
            continue
        for v in n.inputs:
            p = graph.producer(v)
            if p is not None and graph.node(p).phase == pb.BACKWARD:
                problems.append(f"forward {_node_label(n)} depends on backward "
                                f"{_node_label(graph.node(p))} through {values[v].name!r}")
    nodes = graph.nodes
    for n in g.nodes:
        if n.HasField("forward_node_id"):
            target = nodes.get(n.forward_node_id)
            if target is None or target.phase != pb.FORWARD:
                problems.append(f"{_node_label(n)} differentiates node id {n.forward_node_id}, "
                                "which is not a forward node")
    for o in g.outputs:
        p = graph.producer(o.value_id)
        if o.role in FORWARD_OUTPUT_ROLES and p is not None and nodes[p].phase != pb.FORWARD:
            problems.append(f"graph output {o.name!r} is a forward result but is computed by "
                            f"backward {_node_label(nodes[p])}")
    return problems


#: The frontends whose graphs hold no node whose results go unused (`_unused_node_problems`).
_PRUNED_FRONTENDS = ("torch",)


def _unused_node_problems(g: pb.Graph, values: dict) -> list[str]:
    """A node of a torch graph none of whose results a node reads or an output names.

    Why (found by a review): a file with a graph output removed validated and trained:
    a parameter's gradient output removed left its `.grad` None, without a word. The
    torch frontend keeps only what the step uses (AOTAutograd prunes the rest; 235 graphs
    it wrote, none with such a node), so the node that made a removed output is left
    reading into nothing. Random and mutating nodes count for what they do, not for what
    they return. Not caught: an output removed from a node with other results used (a
    BatchNorm's weight gradient, its running-mean update, which its backward reads):
    that needs the frontend to record its outputs."""
    if g.provenance.frontend not in _PRUNED_FRONTENDS:
        return []
    read = {v for n in g.nodes for v in n.inputs} | {o.value_id for o in g.outputs}
    return [f"{_node_label(n)} computes {', '.join(repr(values[v].name) for v in n.outputs)}, "
            f"which no node reads and no graph output names; a graph from the "
            f"{g.provenance.frontend} frontend has no such node, so a graph output was removed "
            f"from it (a parameter's gradient, a buffer's update): lower the model again"
            for n in g.nodes
            if n.outputs and not (n.random or n.mutating) and read.isdisjoint(n.outputs)]


def _hierarchy_problems(g: pb.Graph) -> list[str]:
    clusters = {c.id: c for c in g.hierarchy.clusters}
    node_ids = {n.id for n in g.nodes}
    problems = []
    for c in g.hierarchy.clusters:
        label = f"cluster {c.name!r} (id {c.id})"
        problems += [f"{label} contains node id {n}, which does not exist"
                     for n in c.node_ids if n not in node_ids]
        for child in c.children:
            if child not in clusters:
                problems.append(f"{label} has child cluster id {child}, which does not exist")
            elif clusters[child].level >= c.level:
                problems.append(f"{label} at level {c.level} has child {clusters[child].name!r} "
                                f"at level {clusters[child].level}; children must be at lower levels")
    if g.hierarchy.HasField("root_id") and g.hierarchy.root_id not in clusters:
        problems.append(f"hierarchy root is cluster id {g.hierarchy.root_id}, which does not exist")
    return problems


def _schedule_reference_problems(g: pb.Graph, values: dict) -> list[str]:
    node_ids = {n.id for n in g.nodes}
    problems = []
    for s in g.schedules:
        label = f"schedule {s.name!r}"
        if s.backward_start > len(s.steps):
            problems.append(f"{label} starts backward at step {s.backward_start} "
                            f"but has only {len(s.steps)} steps")
        for k, step in enumerate(s.steps):
            action = step.WhichOneof("action")
            if action is None:
                problems.append(f"{label} step {k} has no action")
            elif action == "compute" and step.compute not in node_ids:
                problems.append(f"{label} step {k} computes node id {step.compute}, which does not exist")
            elif action != "compute" and getattr(step, action) not in values:
                problems.append(f"{label} step {k} {action}s value id {getattr(step, action)}, "
                                "which does not exist")
    return problems
