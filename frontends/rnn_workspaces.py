"""The real size of the workspace oneDNN's LSTM layer hands its backward.

Why: eager's CPU `nn.LSTM` runs oneDNN's layer (`aten.mkldnn_rnn_layer`) when oneDNN is
on, in training too, and remat-ir's trace keeps eager's kernel (`torch.py`'s
`RNN_EAGER_KERNEL_OPS`). The layer returns a workspace its backward reads (its fourth
output), whose size oneDNN decides. PyTorch's meta kernel gives it zero elements, so the
graph counted no bytes for a tensor that lives from the forward to the backward: 32 KiB
for a 16-wide layer over 5 steps of 4, about the size of the layer's output times the
gates, missing from every plan's peak.

So after lowering, each such layer runs once on zeros of its inputs' shapes (with grad
mode on, as the runtime runs it: `runtimes/grad_mode_kernels.py`), and its workspace
value and storage take the size the kernel returned.
"""

from __future__ import annotations

import torch

from remat_ir.ir import Graph
from remat_ir.ir.arguments import decode
from remat_ir.torchlib.types import empty_tensor, resolve_op, to_torch_argument

#: The op, and the position of its workspace among its outputs.
LAYER, WORKSPACE = "aten.mkldnn_rnn_layer.default", 3


def size_rnn_workspaces(graph: Graph) -> None:
    """Give every oneDNN LSTM layer's workspace value in `graph` (and its storage) the
    bytes the kernel allocates for it (module docstring)."""
    storages = {s.id: s for s in graph.proto.storages}
    cpu = torch.device("cpu")
    for node in graph.proto.nodes:
        if node.op != LAYER or len(node.outputs) <= WORKSPACE:
            continue
        tensors = {v: empty_tensor(graph.value(v), cpu).zero_() for v in node.inputs}

        def tensor(ref):
            return tensors[ref.value_id]
        args = [to_torch_argument(decode(a), tensor, cpu) for a in node.args]
        kwargs = {kw.name: to_torch_argument(decode(kw.value), tensor, cpu) for kw in node.kwargs}
        with torch.enable_grad():
            workspace = resolve_op(node.op)(*args, **kwargs)[WORKSPACE]
        value = graph.value(node.outputs[WORKSPACE])
        del value.shape[:], value.stride[:]
        value.shape.append(workspace.numel())
        value.stride.append(1)
        value.size_bytes = workspace.numel() * workspace.element_size()
        storage = storages[value.storage_id]
        storage.size_bytes = max(storage.size_bytes, value.size_bytes)
