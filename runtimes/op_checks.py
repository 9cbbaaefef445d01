"""Whether the PyTorch runtime can run a node's op as the graph says it runs.

A graph file is written by the torch frontend, by hand or by another tool: its op names
and flags are claims the simulator and the solvers take on trust (the IR knows no ops).
Five claims decide what the runtime computes, and each wrong one trained silently or
failed at a later call, so they are checked against the op's schema before any code is
generated (`codegen`), and by `remat-ir validate` for graphs of PyTorch ops:

- the op exists in this process (`resolve_op`);
- an op that draws random numbers is marked `Node.random`: the plan keeps eager's draws
  only for nodes so marked (a file whose flags were lost trained with other draws and
  left the generator elsewhere, a gradient 5.6e-2 off);
- an op that must run once per step (`ONCE_PER_STEP`: SpecAugment's mask draw) is marked
  `Node.non_recomputable`, and the module that draws its mask is there;
- an op that writes into an argument is marked `Node.mutating`, which a schedule runs
  once (a file whose flags were lost ran `aten.mul.out` twice, over the input its first
  run wrote: every gradient off, up to 0.14);
- the node's arguments bind to the op's schema (`_arguments_problem`): counts, keyword
  names, required ones, tensors where it takes them.

One more is checked by the op's name (`check_claims`), as the torch frontend sets it:
`Node.rng_shape_only` only on an op whose draws depend on shapes alone.
"""

from __future__ import annotations

import torch

from remat_ir.ir import Graph, pb
from remat_ir.ir.fusion import body_nodes
from remat_ir.ir.rng import SHAPE_ONLY_RANDOM_OPS
from remat_ir.torchlib import spec_augment
from remat_ir.torchlib.types import ONCE_PER_STEP, resolve_op


class UnsupportedOp(Exception):
    """An IR op the PyTorch runtime cannot execute (named with the module it came from)."""


def checked_op(graph: Graph, node_id: int, node: pb.Node | None = None):
    """The OpOverload of the node's op (or of `node`, a member of fused node `node_id`);
    raises UnsupportedOp where the op is unknown or its node's flags deny its schema."""
    node = graph.node(node_id) if node is None else node
    try:
        op = resolve_op(node.op)
    except LookupError as exc:
        raise UnsupportedOp(f"{exc}; it comes from {node.source or 'an unknown module'} "
                            f"({graph.describe_node(node_id)})") from None
    check_claims(graph, node_id, node)
    if not isinstance(op, torch._ops.OpOverload):
        return op
    if node.op in ONCE_PER_STEP and not graph.node(node_id).non_recomputable:
        raise UnsupportedOp(f"{node.op} must run once per step but {graph.describe_node(node_id)} is not "
                            f"marked non_recomputable in the graph (Node.non_recomputable), so a schedule "
                            f"may run it twice: lower the model again (the torch frontend marks it)")
    if node.op == spec_augment.OP and node.args and node.args[0].HasField("string_value"):
        problem = spec_augment.missing(node.args[0].string_value)
        if problem:
            raise UnsupportedOp(f"{graph.describe_node(node_id)} draws transformers' SpecAugment mask, but {problem}")
    if torch.Tag.nondeterministic_seeded in op.tags and not graph.node(node_id).random \
            and not any(argument.name == "dropout_p" for argument in op._schema.arguments):
        raise UnsupportedOp(f"{node.op} draws random numbers but {graph.describe_node(node_id)} is not "
                            f"marked random in the graph (Node.random), so no schedule can keep "
                            f"eager's draws: lower the model again (the torch frontend marks them)")
    if (problem := _arguments_problem(op._schema, node)) is not None:
        raise UnsupportedOp(f"{graph.describe_node(node_id)} {problem}, where {node.op} is "
                            f"`{op._schema}`: the graph was not written for this op (a file edited "
                            f"by hand, or another torch): lower the model again")
    if op._schema.is_mutable and not node.mutating:
        raise UnsupportedOp(f"{node.op} writes into one of its arguments but {graph.describe_node(node_id)} "
                            f"is not marked mutating in the graph (Node.mutating), so a schedule may run it "
                            f"twice: lower the model again (the torch frontend marks them)")
    return op


#: The argument kinds an op taking a tensor takes (torch wraps a number: `mul.Tensor(t, 2.0)`).
_TENSOR_LIKE = frozenset({"tensor", "int_value", "float_value", "bool_value", "big_int", "complex_value"})


def _arguments_problem(schema, node: pb.Node) -> str | None:
    """What in the node's arguments the op's schema cannot take, said; or None: too many
    positional ones, a keyword it has not or gets twice, a required one missing, a tensor
    where it takes none or none where it takes a tensor. Found by hunt68: a file edited so
    raised torch's own error from inside the generated step, naming no node. A node giving
    no arguments at all is left alone (a graph built for planning alone names none)."""
    if not node.args and not node.kwargs:
        return None
    positional = [a for a in schema.arguments if not a.kwarg_only]
    if len(node.args) > len(positional):
        return f"gives {len(node.args)} positional arguments, more than the op's {len(positional)}"
    by_name = {a.name: a for a in schema.arguments}
    given = {a.name: argument for a, argument in zip(positional, node.args)}
    for keyword in node.kwargs:
        if keyword.name not in by_name:
            return f"gives argument {keyword.name!r}, which the op has not"
        if keyword.name in given:
            return f"gives argument {keyword.name!r} twice"
        given[keyword.name] = keyword.value
    for name, spec in by_name.items():
        if name not in given:
            if not spec.has_default_value():
                return f"does not give argument {name!r}, which the op needs"
            continue
        kind, takes = given[name].WhichOneof("kind"), str(spec.type)
        if takes == "Tensor" and kind not in _TENSOR_LIKE:
            return f"gives argument {name!r} a {kind}, where the op takes a tensor"
        if kind == "tensor" and "Tensor" not in takes:
            return f"gives argument {name!r} a tensor, where the op takes {takes}"
    return None


def _packet(op: str) -> str:
    """The op's name as the frontend's set spells it: "poisson" for aten.poisson.default."""
    parts = op.split(".")
    return parts[1] if len(parts) > 1 else op


def check_claims(graph: Graph, node_id: int, node: pb.Node) -> None:
    """Raise UnsupportedOp where `node` claims `rng_shape_only` for an op the torch
    frontend never marks so.

    Why (found by a review): the runtime trusted it. A file marking poisson or
    rrelu_with_noise_functional shape-only let a schedule draw past it on placeholder
    inputs, other numbers than eager's (a loss 0.15 off, no error). (`autocast_cast_back`,
    on a node the runtime does not run, is checked with the graph's structure:
    `ir.validation`.)"""
    if node.rng_shape_only and _packet(node.op) not in SHAPE_ONLY_RANDOM_OPS:
        raise UnsupportedOp(f"{graph.describe_node(node_id)} is marked rng_shape_only in the graph "
                            f"(Node.rng_shape_only), but the draws of {node.op} are not known to "
                            f"depend on shapes alone, so the runtime may not skip it: lower the "
                            f"model again (the torch frontend marks the ops whose draws do)")


def op_problems(graph: Graph) -> list[str]:
    """What `checked_op` refuses, for every node and fused member of `graph`."""
    problems = []
    for node in graph.proto.nodes:
        for member in body_nodes(node):
            try:
                checked_op(graph, node.id, member)
            except UnsupportedOp as refused:
                problems.append(str(refused))
    return problems
