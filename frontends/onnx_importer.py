"""ONNX importer: an ONNX model -> a trainable torch module (`OnnxModule`) and example inputs.

ONNX has no backward, so the frontend does not lower ONNX nodes to IR nodes
itself: this importer turns the graph into an `nn.Module` (`OnnxModule`) whose
forward runs each ONNX node through this project's op table (`onnx_ops.OPS`),
and `onnx.lower_module` hands that module to the PyTorch lowering, so that the
backward, the exact tensor sizes and the storage aliasing are PyTorch's. Kept
apart from the lowering because it is all about ONNX: files, opsets, shapes,
constant folding; it knows nothing of the IR.

Import, in order:

1. every op type is checked against the table, and one error lists all the
   unsupported ones with their node names, before anything else is done;
   opsets below 13 are first converted to 13 (`onnx.version_converter`),
   opsets above 21 are refused;
2. example inputs fix every dimension (dynamic ones like batch and sequence
   need them; a model without dynamic dimensions gets generated inputs);
3. nodes whose inputs are all constants, and `Shape`/`Size` of any tensor,
   are evaluated once, now: shape arithmetic (`Shape` -> `Gather` -> `Concat`
   -> `Reshape`), `Constant`, `ConstantOfShape` become Python values, so the
   traced graph has static shapes only; the other nodes run on meta tensors to
   learn their output shapes, which are checked against ONNX shape inference;
4. float initializers that feed a differentiable input of some node (a
   `MatMul` or `Add` operand, a `Conv` weight, a `LayerNormalization` scale;
   not a `BatchNormalization` mean or a `Gather` index) become parameters, by
   their ONNX name; other float initializers become buffers, and integer
   tensors, scalars and folded values stay constants (non-persistent buffers).

The module itself is `onnx_module.OnnxModule`; lowering it into the IR is
`onnx.lower_module`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from .onnx_module import OnnxModule
from .onnx_ops import DTYPES, OPS, NodeInfo, OpError, torch_dtype
from .torch import LoweringError

#: Opsets whose semantics the op table follows; older models are converted to MIN_OPSET.
MIN_OPSET, MAX_OPSET = 13, 21
_DEFAULT_DOMAINS = ("", "ai.onnx")
_FLOAT_TYPES = (1, 10, 11, 16)  # float, float16, double, bfloat16
#: How `trainable` may be given besides a collection of names.
TRAINABLE_MODES = ("initializers", "constants")


class UnsupportedOps(LoweringError):
    """Op types the table lacks; `ops` maps each to the names of the nodes that use it."""

    def __init__(self, source: str, ops: dict[str, list[str]]):
        self.ops = ops
        listed = "; ".join(f"{op} (node{'s' if len(names) > 1 else ''} "
                           + ", ".join(repr(n) for n in names[:5])
                           + (f" and {len(names) - 5} more" if len(names) > 5 else "") + ")"
                           for op, names in sorted(ops.items()))
        super().__init__(f"{source}: {len(ops)} op type{'s' if len(ops) > 1 else ''} not supported by "
                         f"the ONNX frontend: {listed}. Supported ops are the keys of "
                         "remat_ir.frontends.onnx_ops.OPS")


# ---------------------------------------------------------------- reading the model

def load_model(model_or_path):
    """(ModelProto, a name for messages) from a path, bytes, or a ModelProto."""
    import onnx

    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path, model_or_path.graph.name or "ONNX model"
    if isinstance(model_or_path, (bytes, bytearray)):
        try:
            return onnx.load_from_string(bytes(model_or_path)), "ONNX model"
        except Exception as exc:
            raise LoweringError(f"the bytes given are not an ONNX model: {_first_line(exc)}") from None
    if isinstance(model_or_path, (str, os.PathLike)):
        path = os.fspath(model_or_path)
        if not os.path.isfile(path):
            raise LoweringError(f"{path}: no such ONNX file")
        try:
            return onnx.load(path), path
        except Exception as exc:
            raise LoweringError(f"{path}: not a readable ONNX model ({_first_line(exc)})") from None
    raise LoweringError(f"expected an ONNX model (a path, bytes or onnx.ModelProto), "
                        f"got {type(model_or_path).__name__}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _node_label(node, index: int) -> str:
    """The node's name, or '<OpType #index>' for the unnamed (names are optional in ONNX)."""
    return node.name or f"<{node.op_type} #{index}>"


def check_ops(model, source: str = "ONNX model") -> None:
    """Raise `UnsupportedOps` naming every op type (and its nodes) the table lacks."""
    missing: dict[str, list[str]] = {}
    for index, node in enumerate(model.graph.node):
        if node.domain in _DEFAULT_DOMAINS and node.op_type in OPS:
            continue
        key = node.op_type if node.domain in _DEFAULT_DOMAINS else f"{node.domain}.{node.op_type}"
        missing.setdefault(key, []).append(_node_label(node, index))
    if missing:
        raise UnsupportedOps(source, missing)


def _opset(model, source: str) -> int:
    versions = [o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS]
    if not versions:
        raise LoweringError(f"{source}: the model imports no default-domain opset")
    return versions[0]


def check_single_assignment(model, source: str = "ONNX model") -> None:
    """Raise `LoweringError` where a tensor is made twice: by two nodes, or by a node and as
    a graph input or initializer. onnx.checker and onnxruntime refuse such a graph; it was
    imported taking the later definition, and trained without a word (hunt68: a weight
    read only by the earlier one got no gradient)."""
    made = {name: "the graph's input" for name in (i.name for i in model.graph.input)}
    made.update({init.name: "an initializer" for init in model.graph.initializer})
    for index, node in enumerate(model.graph.node):
        for name in node.output:
            if not name:
                continue
            if name in made:
                raise LoweringError(f"{source}: tensor {name!r} is made by node {_node_label(node, index)!r} "
                                    f"({node.op_type}) and by {made[name]}; an ONNX graph makes each tensor "
                                    f"once (single static assignment, as onnx.checker says): export it again")
            made[name] = f"node {_node_label(node, index)!r} ({node.op_type})"


def _prepared(model, source: str):
    """The model with local functions inlined, its ops checked, and its opset in range."""
    if len(model.functions):
        from onnx import inliner
        model = inliner.inline_local_functions(model)
    check_ops(model, source)
    check_single_assignment(model, source)
    opset = _opset(model, source)
    if opset > MAX_OPSET:
        raise LoweringError(f"{source}: opset {opset} is newer than the ONNX frontend's op table "
                            f"(opsets {MIN_OPSET} to {MAX_OPSET}); export with opset {MAX_OPSET} or older")
    if opset < 11:
        resized = [_node_label(n, i) for i, n in enumerate(model.graph.node) if n.op_type in ("Resize", "Upsample")]
        if resized:
            # Before opset 11 these compute with asymmetric coordinates, which the version
            # converter does not write into the converted node, so it read as half_pixel:
            # 0.7 off onnxruntime (found by a review).
            raise LoweringError(f"{source}: node {resized[0]!r}: Resize/Upsample of opset {opset} "
                                f"(before 11) is not supported by the ONNX frontend; export with opset "
                                f"{MIN_OPSET} to {MAX_OPSET}")
    if opset < MIN_OPSET:
        from onnx import version_converter
        try:
            model = version_converter.convert_version(model, MIN_OPSET)
        except Exception as exc:
            raise LoweringError(f"{source}: opset {opset} could not be converted to opset {MIN_OPSET} "
                                f"(onnx.version_converter: {_first_line(exc)}); export with opset "
                                f"{MIN_OPSET} to {MAX_OPSET}") from None
        check_ops(model, source)
    return model


def tensor_of(proto) -> torch.Tensor:
    """An ONNX TensorProto as a CPU torch tensor (external data already loaded)."""
    from onnx import numpy_helper

    if proto.data_type == 16:  # bfloat16: numpy has no such dtype; reinterpret the bits
        bits = _array_of(proto).view("uint16").astype("int32")
        return torch.from_numpy(bits).to(torch.int16).view(torch.bfloat16).clone()
    try:
        dtype = torch_dtype(proto.data_type)
    except OpError as exc:
        raise LoweringError(f"tensor {proto.name!r}: {exc}") from None
    return torch.from_numpy(_array_of(proto).copy()).to(dtype)


def _array_of(proto):
    """The tensor's data as a NumPy array; a LoweringError naming it where its data does not
    fit its shape, or its external data cannot be read (hunt68: NumPy's or onnx's own error,
    naming neither tensor nor file, and a traceback from `remat-ir convert`)."""
    from onnx import numpy_helper

    try:
        return numpy_helper.to_array(proto)
    except Exception as exc:
        where = (": its data is in a separate file, so pass the model's path (which finds that file "
                 "beside it), not its bytes or a ModelProto loaded without it"
                 if proto.data_location == proto.EXTERNAL else "; export the model again")
        raise LoweringError(f"tensor {proto.name!r} (shape {list(proto.dims)}): its data cannot be read "
                            f"({_first_line(exc)}){where}") from None


def _attributes(node) -> dict:
    import onnx

    out = {}
    for a in node.attribute:
        value = onnx.helper.get_attribute_value(a)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode() for v in value]
        elif isinstance(value, onnx.TensorProto):
            value = tensor_of(value)
        out[a.name] = value
    return out


# ---------------------------------------------------------------- inputs

def _dims(value_info) -> list:
    """Each dimension as an int, its symbolic name, or None when unnamed and unknown."""
    shape = value_info.type.tensor_type.shape
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in shape.dim]


def _example_tensors(inputs, example_inputs, source: str) -> tuple[torch.Tensor, ...]:
    """The example tensors in graph order, checked against each input's type and static dims."""
    names = [vi.name for vi in inputs]
    for vi in inputs:
        if not vi.type.HasField("tensor_type"):
            raise LoweringError(f"{source}: input {vi.name!r} is not a tensor (sequences, maps and "
                                "optionals are not supported)")
    if example_inputs is None:
        dynamic = [(vi.name, _dims(vi)) for vi in inputs
                   if not vi.type.tensor_type.HasField("shape") or not all(isinstance(d, int) for d in _dims(vi))]
        if dynamic:
            listed = ", ".join(f"{name!r} {dims}" for name, dims in dynamic)
            raise LoweringError(f"{source}: inputs with dynamic dimensions need example inputs to fix "
                                f"them: {listed}; pass example_inputs (a tuple in graph order or a dict "
                                "by input name; on the command line --shape NAME=2x16)")
        generator = torch.Generator().manual_seed(0)
        made = []
        for vi in inputs:
            try:
                dtype = torch_dtype(vi.type.tensor_type.elem_type)
            except OpError as exc:
                raise LoweringError(f"{source}: graph input {vi.name!r}: {exc}; remat-ir trains "
                                    f"graphs of numeric tensors (preprocess strings outside the "
                                    f"model)") from None
            shape = _dims(vi)
            made.append(torch.randn(shape, generator=generator, dtype=dtype) if dtype.is_floating_point
                        else torch.zeros(shape, dtype=dtype))
        return tuple(made)
    if isinstance(example_inputs, Mapping):
        unknown = [k for k in example_inputs if k not in names]
        missing = [n for n in names if n not in example_inputs]
        if unknown or missing:
            raise LoweringError(f"{source}: example inputs by name must name each graph input once: "
                                + (f"unknown {unknown}; " if unknown else "")
                                + (f"missing {missing}; " if missing else "") + f"the inputs are {names}")
        given = [example_inputs[n] for n in names]
    else:
        one = isinstance(example_inputs, torch.Tensor) or (
            hasattr(example_inputs, "__array__") and not isinstance(example_inputs, (list, tuple)))
        given = [example_inputs] if one else list(example_inputs)
        if len(given) != len(names):
            raise LoweringError(f"{source}: {len(given)} example inputs given, but the graph has "
                                f"{len(names)} inputs: {names}")
    tensors = []
    for vi, value in zip(inputs, given):
        t = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
        expected = torch_dtype(vi.type.tensor_type.elem_type)
        if t.dtype != expected:
            raise LoweringError(f"{source}: example input {vi.name!r} is {t.dtype}, but the graph "
                                f"declares {expected}")
        if vi.type.tensor_type.HasField("shape"):
            dims = _dims(vi)
            if len(dims) != t.dim() or any(isinstance(d, int) and d != s for d, s in zip(dims, t.shape)):
                raise LoweringError(f"{source}: example input {vi.name!r} has shape {list(t.shape)}, "
                                    f"but the graph declares {dims}")
        tensors.append(t)
    return tuple(tensors)


#: The metadata key under which PyTorch's exporter (`torch.onnx.export(..., dynamo=True)`)
#: records what each graph input and initializer was in the exported program.
_EXPORTED_KIND = "pkg.torch.export.graph_signature.InputSpec.kind"


def _exported_buffers(graph) -> set[str]:
    """The initializers PyTorch's exporter marks as something other than a parameter (a
    buffer: a registered mask, BatchNorm's statistics): trained as parameters, they
    drifted from the torch model (found by a review). Initializers its optimizer folded
    (a Linear's transposed weight, a position table sliced to the sequence, but also
    rotary tables computed from a buffer) carry no such mark, and which tensors they came
    from cannot be told apart: they stay trainable, as they were (freezing them froze
    sliced parameters too: found by a review)."""
    return {vi.name for vi in list(graph.value_info) + list(graph.input)
            for entry in vi.metadata_props if entry.key == _EXPORTED_KIND and entry.value != "PARAMETER"}


# ---------------------------------------------------------------- import

class _Importer:
    """Walks the (topologically ordered) ONNX graph once: folds, infers shapes, builds steps."""

    def __init__(self, model, examples: tuple, inputs, trainable, source: str, opset: int):
        self.model, self.graph, self.source, self.opset = model, model.graph, source, opset
        self.const: dict[str, torch.Tensor] = {}   # values known at import (CPU tensors)
        self.meta: dict[str, torch.Tensor] = {}    # every value's shape and dtype (meta tensors)
        self.params: set[str] = set()
        self.float_initializers: set[str] = set()
        self.input_names = [vi.name for vi in inputs]
        for name, t in zip(self.input_names, examples):
            self.meta[name] = t.to("meta")
        for init in self.graph.initializer:
            t = tensor_of(init)
            self.const[init.name] = t
            self.meta[init.name] = t.to("meta")
            if init.data_type in _FLOAT_TYPES and t.dim() >= 1:
                self.float_initializers.add(init.name)
        self.trainable = self._trainable_names(trainable)
        for name in self.trainable & set(self.const):  # initializers; folded values join as computed
            if self._can_train(name, self.const[name]):
                self.params.add(name)

    def _trainable_names(self, trainable) -> set[str]:
        if not isinstance(trainable, str):
            names = set(trainable)
            self.explicit = names
            return names
        self.explicit = None
        if trainable not in TRAINABLE_MODES:
            raise LoweringError(f"trainable must be one of {TRAINABLE_MODES} or a collection of "
                                f"tensor names, not {trainable!r}")
        candidates = set(self.float_initializers)
        if trainable == "constants":
            candidates |= {o for n in self.graph.node if n.op_type in ("Constant", "ConstantOfShape")
                           for o in n.output}
        fed = {name for node in self.graph.node for pos, name in enumerate(node.input)
               if name and OPS[node.op_type].differentiable(pos)}
        if trainable == "initializers":
            candidates -= _exported_buffers(self.graph)
        return candidates & fed

    def is_constant(self, name: str) -> bool:
        return name in self.const and name not in self.params

    def _fail(self, node, index: int, message: str) -> LoweringError:
        return LoweringError(f"{self.source}: node {_node_label(node, index)!r} ({node.op_type}): {message}")

    def _call(self, node, index, info, args, on_meta: bool):
        try:
            out = OPS[node.op_type].fn(info, *args)
        except OpError as exc:
            raise self._fail(node, index, f"{exc} is not supported by the ONNX frontend") from None
        except Exception as exc:
            shapes = [list(a.shape) if isinstance(a, torch.Tensor) else a for a in args]
            hint = ("; its output shape may depend on runtime data, which a static training graph "
                    "cannot hold" if on_meta else "")
            raise self._fail(node, index, f"failed on inputs {shapes}: {_first_line(exc)}{hint}") from None
        return out if isinstance(out, tuple) else (out,)

    def run(self, module: OnnxModule) -> OnnxModule:
        needed: list[str] = []  # constants and parameters the runtime nodes read, in order
        for index, node in enumerate(self.graph.node):
            spec = OPS[node.op_type]
            names = list(node.input)
            for pos, name in enumerate(names):
                if name and name not in self.meta:
                    raise self._fail(node, index, f"input {pos} {name!r} is produced by no earlier node "
                                                  "(the graph is not topologically sorted, or it is missing)")
            info = NodeInfo(_node_label(node, index), node.op_type, _attributes(node), self.opset, node.output)
            fold = not spec.random and all(
                not n or self.is_constant(n) or (spec.shape_only and n in self.meta) for n in names)
            if fold:
                args = []
                for pos, name in enumerate(names):
                    if not name:
                        args.append(None)
                    elif spec.shape_only:
                        args.append(self.meta[name])
                    elif pos in spec.static:
                        args.append(self.const[name].tolist())
                    else:
                        args.append(self.const[name])
                outs = self._call(node, index, info, _trim(args), on_meta=False)
                for name, value in zip(node.output, outs):
                    if name and value is not None:
                        self.const[name] = value
                        self.meta[name] = value.to("meta")
                        if name in self.trainable and self._can_train(name, value):
                            self.params.add(name)
                continue
            slots, runtime, meta_args = [], [], []
            for pos, name in enumerate(names):
                if not name:
                    slots.append(("none",))
                    meta_args.append(None)
                elif pos in spec.static:
                    if not self.is_constant(name):
                        # Dropout's ratio and training mode are static too (found by a
                        # review: they were said to be a shape, axis or size).
                        sets = ("its ratio or training mode" if node.op_type == "Dropout"
                                else "a shape, axis or size")
                        raise self._fail(node, index, f"input {pos} {name!r} sets {sets}, so it must be "
                                                      "computable when the model is imported (from "
                                                      "initializers, Constant nodes and shapes), but it "
                                                      "depends on the graph's inputs: make it an "
                                                      "initializer or a Constant node")
                    value = self.const[name].tolist()
                    slots.append(("static", value))
                    meta_args.append(value)
                else:
                    slots.append(("runtime",))
                    runtime.append(name)
                    meta_args.append(self.meta[name])
                    if name in self.const:
                        needed.append(name)
            outs = self._call(node, index, info, _trim(meta_args), on_meta=True)
            for name, value in zip(node.output, outs):
                if name and value is not None:
                    self.meta[name] = value
            module.add_node(f"n{index}", info, slots, tuple(runtime), tuple(node.output))
        for out in self.graph.output:
            if out.name not in self.meta:
                raise LoweringError(f"{self.source}: graph output {out.name!r} is produced by no node")
            if out.name in self.const:
                needed.append(out.name)
        if self.explicit is not None:
            odd = sorted(self.explicit - self.params)
            if odd:
                raise LoweringError(f"{self.source}: trainable names {odd} are not float tensors (rank >= 1) "
                                    "that the graph computes from constants alone")
        for name in dict.fromkeys(needed):
            value = self.const[name]
            kind = ("parameter" if name in self.params
                    else "buffer" if name in self.float_initializers else "constant")
            module.add_tensor(name, value, kind)
        module.input_names = list(self.input_names)
        module.output_names = [o.name for o in self.graph.output]
        return module

    def _can_train(self, name: str, value: torch.Tensor) -> bool:
        if value.is_floating_point() and value.dim() >= 1:
            return True
        if self.explicit is not None:
            raise LoweringError(f"{self.source}: trainable tensor {name!r} is {value.dtype} of shape "
                                f"{list(value.shape)}; only float tensors of rank >= 1 can be trained")
        return False


def _trim(args: list) -> list:
    """Drop trailing omitted optional inputs so the op's defaults apply."""
    args = list(args)
    while args and args[-1] is None:
        args.pop()
    return args


def _check_shapes(model, examples, importer: _Importer, source: str) -> None:
    """Each output shape and dtype the op table produced, against ONNX shape inference."""
    import onnx

    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    inits = {i.name for i in fixed.graph.initializer}
    user = [vi for vi in fixed.graph.input if vi.name not in inits]
    for vi, t in zip(user, examples):
        shape = vi.type.tensor_type.shape
        del shape.dim[:]
        for size in t.shape:
            shape.dim.add().dim_value = size
    # Shapes recorded in the file were written for the export's inputs: infer them afresh.
    del fixed.graph.value_info[:]
    for out in fixed.graph.output:
        out.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(fixed, strict_mode=False, data_prop=True)
    except Exception:
        return  # shape inference itself failed: nothing to compare with
    inferred_infos = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    # Values downstream of one where shape inference is known to be wrong inherit its
    # shape: not compared (a Relu after such a pool was refused as an op table bug).
    diverged: set[str] = set()
    for index, node in enumerate(model.graph.node):
        if any(name in diverged for name in node.input):
            diverged.update(node.output)
            continue
        for name in node.output:
            vi = inferred_infos.get(name)
            ours = importer.meta.get(name)
            if vi is None or ours is None or not vi.type.HasField("tensor_type"):
                continue
            tt = vi.type.tensor_type
            if not tt.HasField("shape"):
                continue
            dims = _dims(vi)
            if not all(isinstance(d, int) for d in dims):
                continue
            problem = None
            if list(ours.shape) != dims:
                if _inference_known_wrong(node, ours, dims):
                    diverged.add(name)
                    continue
                problem = f"shape {list(ours.shape)}, but ONNX shape inference gives {dims}"
            elif tt.elem_type in DTYPES and torch_dtype(tt.elem_type) != ours.dtype:
                problem = f"dtype {ours.dtype}, but ONNX shape inference gives {torch_dtype(tt.elem_type)}"
            if problem:
                raise LoweringError(f"{source}: node {_node_label(node, index)!r} ({node.op_type}) output "
                                    f"{name!r}: the op table gives {problem} (a bug in the op table: "
                                    "please report it)")


def _inference_known_wrong(node, ours, dims) -> bool:
    """Whether ONNX shape inference is known to disagree with onnxruntime (and the spec)
    here, so that the comparison would refuse a valid model as a bug of the op table:
    - a ConvTranspose asked for an `output_shape` smaller than its input: it drops the
      spatial dimensions ([1, 3] where onnxruntime computes [1, 3, 2]);
    - a ConvTranspose with `auto_pad` SAME and an `output_padding`: its sizes follow no
      rule onnxruntime's do (input * stride plus the padding, or the full output plus it;
      the table's outputs equal onnxruntime's on all 170 such 1-d cases up to size 5);
    - a pool with `ceil_mode`: it keeps a window that would start in the right padding,
      which the spec leaves out (and onnxruntime, and torch for its own padding);
    - a float Range: it counts the elements in float32, where a start of -1e-9 is lost
      (1 / 0.5: 2 elements where onnxruntime makes 3);
    - a Resize by scales: it multiplies in double precision, onnxruntime in float32
      (10 * 0.7: 6 rows where onnxruntime makes 7)."""
    attrs = {a.name: a for a in node.attribute}
    if node.op_type == "ConvTranspose" and "output_shape" in attrs and len(dims) < len(ours.shape):
        return True
    if node.op_type == "Range" and ours.is_floating_point() and len(dims) == ours.dim() == 1:
        return abs(ours.shape[0] - dims[0]) <= 1
    if node.op_type == "Resize" and len(dims) == ours.dim():
        return all(abs(o - d) <= 1 for o, d in zip(ours.shape, dims))
    if len(dims) != len(ours.shape) or list(ours.shape[:2]) != dims[:2]:
        return False
    spatial = zip(ours.shape[2:], dims[2:])
    if node.op_type == "ConvTranspose" and any(attrs["output_padding"].ints if "output_padding" in attrs else ()) \
            and "auto_pad" in attrs and attrs["auto_pad"].s.decode() in ("SAME_UPPER", "SAME_LOWER"):
        return True
    if node.op_type in ("MaxPool", "AveragePool") and "ceil_mode" in attrs and attrs["ceil_mode"].i:
        return all(d - o in (0, 1) for o, d in spatial)
    return False


def to_torch(model_or_path, example_inputs=None, *, trainable="initializers") -> tuple[OnnxModule, tuple]:
    """Import an ONNX model: (`OnnxModule`, example inputs in graph order).

    `example_inputs` (a tuple in graph order, a dict by input name, or one tensor) fix
    dynamic dimensions; without them every dimension must be static. `trainable`:
    "initializers" (float initializers of rank >= 1 feeding a differentiable input, but
    for those PyTorch's exporter marks as buffers: `_exported_buffers`),
    "constants" (also `Constant`/`ConstantOfShape` outputs that do: the weight-stripped
    model-zoo graphs in the `onnx` package store every weight that way), or a
    collection of tensor names. Raises `LoweringError` naming the node or input at fault.
    """
    model, source = load_model(model_or_path)
    model = _prepared(model, source)
    opset = _opset(model, source)
    inits = {i.name for i in model.graph.initializer}
    inputs = [vi for vi in model.graph.input if vi.name not in inits]  # IR < 4 lists initializers too
    examples = _example_tensors(inputs, example_inputs, source)
    importer = _Importer(model, examples, inputs, trainable, source, opset)
    module = importer.run(OnnxModule(model.graph.name or "onnx"))
    _check_shapes(model, examples, importer, source)
    module.onnx_source, module.onnx_opset = source, opset
    module.input_specs = [(tuple(t.shape), t.dtype) for t in examples]
    device = next((t.device for t in examples), torch.device("cpu"))
    return module.to(device), examples
