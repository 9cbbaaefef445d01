"""Backward ops that write their result into a gradient dying at them (in-place reuse).

Why: the joint graph is functional, so every backward op allocates its result
while its inputs are still held. Where an input is read by that op alone, eager
PyTorch frees it just after the op; for one moment both are live. At a language
model's loss this moment is the whole step's floor: `_log_softmax_backward_data`
holds the incoming gradient, the saved log-probabilities and its result, three
vocab-sized tensors (GPT-2 12 layers, batch 8 x 512: 3 x 823 MB, 25.9% of the
store-everything peak, which no schedule, offloaded or not, could go below).
Writing the result into the dying gradient's buffer leaves two.

The rewrite, per backward node (`reuse_dying_inputs`):

- the op is one of `REUSING_OPS`, kernels that read each element of an input
  before writing the same element of the output (TensorIterator elementwise ops,
  and softmax backwards, which reduce a row before writing it), so that passing
  that input as `out=` gives the bits the functional op gives;
- the input is an activation or gradient (not resident), read by this node and
  no other, not a graph output, contiguous and exactly as large as its storage,
  with the result's shape and dtype; no input of the result's shape is laid out
  otherwise (given its output, the kernel may iterate in another order and take
  another code path: a complex product with a transposed operand was 1e-7 off);
- the node becomes the op's `out=` overload with that input as `out`, flagged
  `mutating` (so it runs once, and timing copies the input first), and its result,
  with every view of it, moves to the input's storage: the memory model then
  counts the result as a view of the input (`ir.memory.new_storages`) and the
  simulator, every solver and the runtime see one buffer where there were two.

Only backward nodes are rewritten: each runs once per step, so the input it
overwrites is never needed again, whatever a schedule recomputes (a recomputed
forward value is a fresh allocation, read by this node alone).
"""

from __future__ import annotations

import torch

from remat_ir.ir import Graph, pb
from remat_ir.ir.arguments import TensorRef, encode
from remat_ir.ir.gradient_sums import handed_sums
from remat_ir.ir.rng import contiguous_strides

from remat_ir.torchlib.overloads import out_overload
from remat_ir.torchlib.types import op_name, resolve_op

#: Ops whose `out=` overload may be given one of the inputs (same shape and dtype, contiguous)
#: and computes the same bits: each element of the input is read before that element of the
#: output is written. Elementwise ops run on TensorIterator, which accepts an output that fully
#: overlaps an input (what their in-place forms do); the softmax backwards read a whole row
#: (their reduction) before writing any of it, on CPU and CUDA alike. Checked op by op, bit
#: for bit, in tests/test_buffer_reuse.py. Left out: ops whose `out=` overload computes into a
#: temporary and copies it (`mul.Scalar_out`, `div.Scalar_out`: a result-sized workspace on
#: CPU, so writing into the input saves nothing and adds a copy); the same test checks that
#: no op here allocates.
REUSING_OPS = frozenset({
    "aten._log_softmax_backward_data.default", "aten._softmax_backward_data.default",
    "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor",
    "aten.neg.default", "aten.pow.Tensor_Scalar",
    "aten.silu_backward.default", "aten.gelu_backward.default", "aten.tanh_backward.default",
    "aten.sigmoid_backward.default", "aten.threshold_backward.default",
})


def _whole_contiguous(graph: Graph, value: pb.Value) -> bool:
    """The value is its storage's only view, contiguous from offset 0."""
    return (value.storage_offset == 0 and graph.storage_data_bytes(value.storage_id) == value.size_bytes
            and list(value.stride) == contiguous_strides(value.shape))


def reuse_dying_inputs(graph: Graph, *, pointwise: bool = True) -> int:
    """Rewrite, in place, the backward nodes that can write their result into an input read
    by them alone (see the module docstring); return how many were rewritten. With
    `pointwise=False`, ops tagged pointwise keep their functional form: for a backend that
    fuses pointwise chains (Inductor), an `out=` node would split the chain it is in (it
    writes into a value from before its region: an eager line, `runtimes/codegen._Runs`)
    where the fused kernel needs no buffer for it at all."""
    proto = graph.proto
    readers: dict[int, set[int]] = {}
    for node in proto.nodes:
        for v in node.inputs:
            readers.setdefault(graph.value(v).storage_id, set()).add(node.id)
    pinned = {graph.value(v).storage_id for v in graph.output_value_ids} | graph.resident_storage_ids
    values_of: dict[int, list[pb.Value]] = {}
    for value in proto.values:
        values_of.setdefault(value.storage_id, []).append(value)
    # The sums that make a gradient from its parts stay functional: the runtime may hand
    # the parts to autograd instead of running them (`ir.gradient_sums`).
    sums = handed_sums(graph)
    rewritten = 0
    for node in proto.nodes:
        if (node.phase != pb.BACKWARD or node.op not in REUSING_OPS or len(node.outputs) != 1
                or node.id in sums):
            continue
        if not pointwise and torch.Tag.pointwise in resolve_op(node.op).tags:
            continue
        result = graph.value(node.outputs[0])
        if result.storage_id in pinned or not _whole_contiguous(graph, result):
            continue
        if any(list(graph.value(v).shape) == list(result.shape)
               and list(graph.value(v).stride) != contiguous_strides(result.shape) for v in node.inputs):
            # An input of the result's shape laid out otherwise (a transposed gradient): the
            # kernel, given the output, may iterate in another order and take another code
            # path (a complex product, 1e-7 off eager's, fed a weight gradient's sum).
            continue
        target = next((graph.value(v) for v in node.inputs
                       if _overwritable(graph, node, graph.value(v), result, readers, pinned)), None)
        if target is None:
            continue
        found = out_overload(resolve_op(node.op))
        if found is None:
            continue
        overload, out_name = found
        old = result.storage_id
        for value in values_of.pop(old, []):      # the result and every view of it
            value.storage_id = target.storage_id
            values_of[target.storage_id].append(value)
        node.op = op_name(overload)
        node.kwargs.add(name=out_name).value.CopyFrom(encode(TensorRef(target.id)))
        node.mutating = True
        readers[target.storage_id] |= readers.pop(old, set())
        rewritten += 1
    if rewritten:
        graph.drop_unused_storages()
    return rewritten


def _overwritable(graph: Graph, node: pb.Node, value: pb.Value, result: pb.Value,
                  readers: dict[int, set[int]], pinned: set[int]) -> bool:
    return (value.storage_id not in pinned and readers.get(value.storage_id) == {node.id}
            and value.dtype == result.dtype and list(value.shape) == list(result.shape)
            and _whole_contiguous(graph, value))
