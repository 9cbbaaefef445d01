"""The torch module an imported ONNX graph becomes (`OnnxModule`), one submodule per node.

The importer (`onnx_importer.to_torch`) builds it; the lowering (`onnx.lower_module`)
traces it like any PyTorch model. Its forward runs each ONNX node through the op table
(`onnx_ops.OPS`) in graph order. Each node runs inside its own submodule, so that
`torch.export` records the node in every aten op's module stack (`label_of` maps that
path back to the ONNX node's name and op type). Parameters and buffers live under their
ONNX names, nested by dots, so that a state dict reads like the ONNX file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from remat_ir.ir import RematIRError

from .onnx_ops import OPS, NodeInfo

_NODES, _CONSTANTS, _RENAMED = "_onnx_nodes", "_onnx_constants", "_onnx_renamed"


class OnnxInputError(RematIRError):
    """Inputs that do not match the ONNX graph's inputs (names, count, dtype, shape)."""


class OnnxNode(nn.Module):
    """One ONNX node: runs its op-table entry. Static inputs are bound at import."""

    def __init__(self, info: NodeInfo, slots: list):
        super().__init__()
        self.info = info
        self.slots = slots  # per input: ("runtime",), ("static", python value) or ("none",)

    def forward(self, *tensors):
        given = iter(tensors)
        args = [next(given) if s[0] == "runtime" else s[1] if s[0] == "static" else None
                for s in self.slots]
        while args and args[-1] is None and self.slots[len(args) - 1][0] == "none":
            args.pop()  # trailing omitted optional inputs: the function's defaults
        out = OPS[self.info.op_type].fn(self.info, *args)
        return out if isinstance(out, tuple) else (out,)

    def extra_repr(self) -> str:
        return f"{self.info.op_type} {self.info.name!r}"


_NODE_CLASSES: dict[str, type] = {}


def _node_class(op_type: str) -> type:
    """A subclass named after the op type, so module stacks read 'Conv', 'MatMul'."""
    if op_type not in _NODE_CLASSES:
        _NODE_CLASSES[op_type] = type(op_type, (OnnxNode,), {"__module__": __name__})
    return _NODE_CLASSES[op_type]


class OnnxModule(nn.Module):
    """An imported ONNX graph: forward takes the graph inputs (in graph order, or by name)
    and returns its outputs (the tensor when there is one, else a tuple).

    Parameters are the trainable float initializers, under their ONNX names (dotted
    names become nested modules, so "h.0.attn.weight" is `model.h[0].attn.weight`);
    `onnx_names` maps each parameter's and buffer's qualified name to its ONNX name.
    """

    def __init__(self, name: str):
        super().__init__()
        self.onnx_graph_name = name
        self.input_names: list[str] = []
        #: (shape, dtype) of each input as imported: the import evaluates the graph's shape
        #: computations (Shape -> Reshape targets) for them once (`check_inputs`).
        self.input_specs: list[tuple[tuple[int, ...], torch.dtype]] = []
        self.output_names: list[str] = []
        self.onnx_names: dict[str, str] = {}
        self.node_labels: dict[str, tuple[str, str]] = {}  # submodule key -> (ONNX name, op type)
        self._resident: list[tuple[str, str, bool]] = []   # (ONNX value, qualified name, is parameter)
        self._steps: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = []
        self.add_module(_NODES, nn.ModuleDict())
        self.add_module(_CONSTANTS, nn.Module())

    def positional_inputs(self, args: Sequence, kwargs: Mapping) -> tuple:
        """The inputs in graph order, from positional arguments and/or names."""
        names = self.input_names
        if len(args) > len(names):
            raise OnnxInputError(f"{len(args)} inputs given, but the ONNX graph has {len(names)}: {names}")
        unknown = [k for k in kwargs if k not in names]
        twice = [k for k in kwargs if k in names[:len(args)]]
        missing = [n for n in names[len(args):] if n not in kwargs]
        if unknown or twice or missing:
            raise OnnxInputError("inputs do not match the ONNX graph's inputs "
                                 f"{names}: " + "; ".join(
                                     p for p in (f"unknown {unknown}" if unknown else "",
                                                 f"given twice {twice}" if twice else "",
                                                 f"missing {missing}" if missing else "") if p))
        return tuple(args) + tuple(kwargs[n] for n in names[len(args):])

    def check_inputs(self, inputs: Sequence) -> None:
        """OnnxInputError naming the first input whose shape or dtype is not the one the
        graph was imported for. The import folds the graph's shape computations for the
        example inputs (a Reshape to [batch, -1, 2] keeps the example's batch), so another
        batch ran with the example's targets: outputs 0.5 off onnxruntime's, or of another
        shape, silently in eval mode and under no_grad (found by a review)."""
        for name, given, (shape, dtype) in zip(self.input_names, inputs, self.input_specs):
            if not isinstance(given, torch.Tensor):
                raise OnnxInputError(f"input {name!r} is a {type(given).__name__}, not a tensor")
            if tuple(given.shape) != shape or given.dtype != dtype:
                raise OnnxInputError(
                    f"input {name!r} is a {given.dtype} tensor of shape {list(given.shape)}, but the "
                    f"ONNX graph was imported for {dtype} of shape {list(shape)}: the import "
                    f"evaluates the graph's shape computations for its example inputs. Import it "
                    f"again with inputs like these (to_torch / remat_onnx(model, inputs))")

    def forward(self, *args, **kwargs):
        inputs = self.positional_inputs(args, kwargs)
        self.check_inputs(inputs)
        env = dict(zip(self.input_names, inputs))
        for value, qualified, is_parameter in self._resident:
            env[value] = self.get_parameter(qualified) if is_parameter else self.get_buffer(qualified)
        nodes = self._modules[_NODES]
        for key, inputs, outputs in self._steps:
            results = nodes[key](*[env[n] for n in inputs])
            for name, result in zip(outputs, results):
                if name:
                    env[name] = result
        # An output that is a graph input or an initializer, which ONNX allows, is returned
        # as a copy: a step's outputs cannot be its inputs (refused with PyTorch's advice,
        # `.clone()`, which an ONNX user cannot follow; found by a review).
        produced = {name for _, _, outputs in self._steps for name in outputs}
        results = tuple(env[n] if n in produced else env[n].clone() for n in self.output_names)
        return results[0] if len(results) == 1 else results

    # -------------------------------------------------------------- building

    def _slot(self, qualified: str):
        """(module, attribute) where `qualified` would live, or None if it cannot."""
        *path, leaf = qualified.split(".")
        if not leaf or not all(path):
            return None
        module = self
        for part in path:
            child = module._modules.get(part)
            if child is None:
                if hasattr(module, part) or part in module._parameters or part in module._buffers:
                    return None
                return module, None  # free from here on: containers are created
            module = child
        if hasattr(module, leaf) or leaf in module._modules:
            return None
        return module, leaf

    def _place(self, name: str) -> tuple[nn.Module, str, str]:
        """The module and attribute for the ONNX tensor `name` (nested by dots), created."""
        qualified = name
        if name.startswith(("_onnx_",)) or self._slot(name) is None:
            qualified = f"{_RENAMED}." + _safe(name)
            base, n = qualified, 1
            while self._slot(qualified) is None:
                n += 1
                qualified = f"{base}_{n}"
        *path, leaf = qualified.split(".")
        module = self
        for part in path:
            if part not in module._modules:
                module.add_module(part, nn.Module())
            module = module._modules[part]
        return module, leaf, qualified

    def add_node(self, key: str, info: NodeInfo, slots: list, inputs: tuple[str, ...],
                 outputs: tuple[str, ...]) -> None:
        """Append one ONNX node to forward: it reads the values `inputs` (by ONNX name)
        into its runtime slots and writes `outputs`."""
        self._modules[_NODES][key] = _node_class(info.op_type)(info, slots)
        self.node_labels[key] = (info.name, info.op_type)
        self._steps.append((key, inputs, outputs))

    def label_of(self, source_path: str) -> tuple[str, str] | None:
        """(ONNX node name, op type) of the node a torch module path such as
        '_onnx_nodes.n12' (an aten op's module stack) lies in, or None."""
        prefix = _NODES + "."
        if not source_path.startswith(prefix):
            return None
        return self.node_labels.get(source_path[len(prefix):].split(".", 1)[0])

    def renamed_tensors(self) -> dict[str, str]:
        """{qualified name: ONNX name} of the parameters and buffers whose ONNX name could
        not be their attribute path (constants left out)."""
        return {q: n for q, n in self.onnx_names.items() if q != n and not q.startswith(_CONSTANTS)}

    def add_tensor(self, name: str, tensor: torch.Tensor, kind: str) -> str:
        """Register an ONNX tensor as 'parameter', 'buffer' or 'constant'; its qualified name."""
        if kind == "constant":
            holder = self._modules[_CONSTANTS]
            leaf = _safe(name)
            base, n = leaf, 1
            while hasattr(holder, leaf):
                n += 1
                leaf = f"{base}_{n}"
            holder.register_buffer(leaf, tensor, persistent=False)
            qualified = f"{_CONSTANTS}.{leaf}"
        else:
            module, leaf, qualified = self._place(name)
            if kind == "parameter":
                module.register_parameter(leaf, nn.Parameter(tensor))
            else:
                module.register_buffer(leaf, tensor)
        self.onnx_names[qualified] = name
        self._resident.append((name, qualified, kind == "parameter"))
        return qualified


def _safe(name: str) -> str:
    """An attribute name for any ONNX name (no dots, not empty, no leading digit trouble)."""
    cleaned = "".join(c if c.isalnum() or c in "_/-:" else "_" for c in name) or "unnamed"
    return cleaned
