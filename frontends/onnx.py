"""ONNX frontend: an ONNX model -> a trainable torch module -> the joint training graph in the IR.

ONNX has no backward, so the frontend does not lower ONNX nodes to IR nodes
itself. Two steps, in two modules:

- `onnx_importer.to_torch` imports the graph into an `nn.Module`
  (`onnx_module.OnnxModule`) whose forward runs each ONNX node through this
  project's op table (`onnx_ops.OPS`), with static shapes (see that module for
  the import's rules: op check, opset conversion, constant folding, which
  initializers become parameters);
- `lower_module` (here) hands that module to the PyTorch lowering
  (`frontends/torch.py`): the backward, the exact tensor sizes and the storage
  aliasing are then PyTorch's. Each ONNX node ran inside its own submodule, so
  the IR node's `source` is rewritten to the ONNX node's name and op type
  ("node_MatMul_12 (MatMul)"), for forward and backward nodes alike.

This module is the frontend's public face: the names below stay importable from
`remat_ir.frontends.onnx`. Costs are not added here (`remat_ir.lowering.lower_onnx`).
"""

from __future__ import annotations

import json

from remat_ir.ir import Graph

from .onnx_importer import (MAX_OPSET, MIN_OPSET, TRAINABLE_MODES, UnsupportedOps, check_ops,
                            load_model, tensor_of, to_torch)
from .onnx_module import OnnxInputError, OnnxModule, OnnxNode
from .onnx_ops import OPS
from .torch import LoweringError
from .torch import lower as torch_lower


def lower_module(module: OnnxModule, example_inputs: tuple) -> Graph:
    """The joint training graph of an imported model, with ONNX node names as sources
    (no costs: `remat_ir.lowering.lower_onnx_module` adds them)."""
    graph = torch_lower(module, tuple(example_inputs))
    for node in graph.proto.nodes:
        label = module.label_of(node.source.split(" (", 1)[0])
        if label is not None:
            node.source = f"{label[0]} ({label[1]})"
    import onnx

    g = graph.proto
    g.name = module.onnx_graph_name
    g.provenance.frontend, g.provenance.frontend_version = "onnx", onnx.__version__
    g.provenance.source_model = getattr(module, "onnx_source", module.onnx_graph_name)
    g.metadata["onnx.opset"] = str(getattr(module, "onnx_opset", ""))
    g.metadata["onnx.input_names"] = json.dumps(module.input_names)
    g.metadata["onnx.output_names"] = json.dumps(module.output_names)
    renamed = module.renamed_tensors()
    if renamed:
        g.metadata["onnx.renamed_tensors"] = json.dumps(renamed)
    return graph


def lower(model_or_path, example_inputs=None, *, trainable="initializers") -> Graph:
    """The joint forward+backward graph of one training step of an ONNX model, as IR,
    without costs (`remat_ir.lowering.lower_onnx` adds them).

    See `to_torch` for `example_inputs` and `trainable`.
    """
    module, examples = to_torch(model_or_path, example_inputs, trainable=trainable)
    return lower_module(module, examples)


__all__ = ["lower", "to_torch", "OPS", "lower_module", "load_model", "check_ops", "OnnxModule",
           "OnnxNode", "OnnxInputError", "UnsupportedOps", "LoweringError", "MIN_OPSET", "MAX_OPSET",
           "TRAINABLE_MODES", "tensor_of"]
