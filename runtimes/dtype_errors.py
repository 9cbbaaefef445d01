"""One clear error for a step that fails on tensors of different floating dtypes.

A call whose inputs have another dtype than the parameters (float64 into a float32
`nn.Linear`) is a new signature, lowered and planned again without complaint: the
trace does not check dtypes. The op then fails when the step runs, inside generated
code that names no module (on the inductor backend, inside the compiled region that
holds the op). Eager refuses the same call; the message built here says where (the
node's op and module), which dtypes met and what to change.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Sequence

import torch

from remat_ir.ir import Graph, pb
from remat_ir.ir.dtypes import dtype_name
from remat_ir.torchlib.types import torch_dtype


#: A line of the generated forward segment that computes a node: its first output's
#: variable (`codegen._member_lines`: `v7 = op_...(...)`, `v7 = _replay(...)`, or
#: `_r = op_...(...)` followed by `v7 = _r[0]`).
_COMPUTING_LINE = re.compile(r"\s*(?:(v\d+) = (?:op_|_replay\()|_r = op_)")


#: A line of the generated forward segment that calls a compiled region
#: (`codegen._Runs`: `(v7, v9, ) = _region2(_in)`).
_REGION_LINE = re.compile(r"\s*\(.*\) = (_region\d+)\(_in\)")


def _failed_node(graph: Graph, forward_source: str, exc: BaseException,
                 regions: Sequence = ()) -> int | None:
    """The id of the graph node whose op raised `exc` inside the generated forward segment,
    read from the segment's line in the traceback; for a line calling a compiled region
    (`regions`: `compiled.Region`s, by name), the region's first node that reads floating
    tensors of two dtypes (Inductor's trace of it, or its eager run, raised: the region
    names no op). None where it cannot be told: a fused node's member, an error outside
    the segment's ops."""
    frames = [(frame, line) for frame, line in traceback.walk_tb(exc.__traceback__)
              if frame.f_code.co_filename == "<remat-ir forward_segment>"]
    if not frames:
        return None
    lines = forward_source.splitlines()
    number = frames[-1][1] - 1
    if not 0 <= number < len(lines):
        return None
    called = _REGION_LINE.match(lines[number])
    if called is not None:
        region = next((r for r in regions if r.name == called.group(1)), None)
        return None if region is None else next(
            (n for n in region.node_ids if len(_floating_dtypes(graph, graph.node(n))) > 1), None)
    match = _COMPUTING_LINE.match(lines[number])
    if match is None:
        return None
    variable = match.group(1)
    if variable is None and number + 1 < len(lines):  # `_r = op(...)`: the next line names it
        variable = re.match(r"\s*(v\d+) = _r\[", lines[number + 1])
        variable = variable.group(1) if variable else None
    return None if variable is None else graph.producer(int(variable[1:]))


def _floating_dtypes(graph: Graph, node: pb.Node) -> set[int]:
    """The floating dtypes of the tensors `node` reads."""
    return {graph.value(v).dtype for v in node.inputs
            if torch_dtype(graph.value(v).dtype).is_floating_point}


def mixed_dtypes_message(graph: Graph, forward_source: str, exc: RuntimeError,
                         regions: Sequence = ()) -> str | None:
    """The message for an op of the forward segment (`regions`: its compiled regions) that
    failed on tensors of different floating dtypes (None for any other failure, which is
    raised as it is). The trace lets such a call through because `mm`'s meta kernel takes
    float64 by float32."""
    # torch says "same dtype", "expected scalar type Float", "Input type (double) and bias
    # type (float)": a failure that names no type is not about them.
    if isinstance(exc, torch.OutOfMemoryError) or "type" not in str(exc).lower():
        return None
    node_id = _failed_node(graph, forward_source, exc, regions)
    if node_id is None:
        return None
    node = graph.node(node_id)
    floating = _floating_dtypes(graph, node)
    if len(floating) < 2:
        return None
    met = " and ".join(sorted(dtype_name(d) for d in floating))
    parameters = sorted({dtype_name(graph.value(e.value_id).dtype) for e in graph.proto.inputs
                         if graph.value(e.value_id).kind == pb.PARAMETER
                         and torch_dtype(graph.value(e.value_id).dtype).is_floating_point})
    given = [(e.argument_name or e.name, dtype_name(graph.value(e.value_id).dtype))
             for e in graph.user_inputs()
             if torch_dtype(graph.value(e.value_id).dtype).is_floating_point
             and dtype_name(graph.value(e.value_id).dtype) not in parameters]
    where = f" in module {node.source}" if node.source else ""
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if given and parameters:
        names = ", ".join(name for name, _ in given)
        cause = (f"this call's {', '.join(f'{name} is {dtype}' for name, dtype in given)} while "
                 f"the model's parameters are {' and '.join(parameters)}, which eager PyTorch "
                 f"refuses too: pass {names} as {parameters[0]} (`.to(torch.{parameters[0]})`), "
                 f"or convert the model (`model.to(torch.{given[0][1]})`) and call "
                 f"remat_ir.remat on it again")
    else:
        cause = ("eager PyTorch refuses these dtypes too: give the model inputs of the dtype "
                 "its parameters have, or convert the model and call remat_ir.remat on it again")
    return (f"{graph.describe_node(node_id)}{where} read tensors of different "
            f"dtypes ({met}) and failed ({first_line}): {cause}")
