"""The ONNX op table: one entry per ONNX op type, each a torch implementation.

The ONNX frontend (`frontends/onnx.py`) runs every ONNX node through its entry
here, three times over: on real tensors to fold what only depends on constants
(shape arithmetic, `Constant`, `ConstantOfShape`), on meta tensors to learn each
output's shape, and under `torch.export` inside the module that the torch
lowering traces, so that the backward of every op is PyTorch's own.

An entry says, besides the function, which inputs must be known when the model
is imported (`static`: shapes, axes, pads; the function gets them as Python
lists or numbers, so the traced graph has no data-dependent shapes), which
inputs are differentiable (`diff`: a float initializer feeding one of them is a
trainable parameter), whether the op only reads its input's shape
(`shape_only`: `Shape`, `Size`), and whether it draws random numbers (never
folded). Semantics follow the ONNX operator specification for opsets 13 to 21;
where an input or attribute moved between versions (`axes` of the Reduce ops,
`num_outputs` of `Split`) both forms are read.

An implementation that meets an attribute combination it does not implement
raises `OpError`; the frontend reports it with the node's name.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


class OpError(ValueError):
    """An attribute or input combination this table does not implement (message says which)."""


#: ONNX TensorProto element types -> torch dtypes (those torch can compute with).
DTYPES: dict[int, torch.dtype] = {
    1: torch.float32, 2: torch.uint8, 3: torch.int8, 4: torch.uint16, 5: torch.int16,
    6: torch.int32, 7: torch.int64, 9: torch.bool, 10: torch.float16, 11: torch.float64,
    12: torch.uint32, 13: torch.uint64, 14: torch.complex64, 15: torch.complex128,
    16: torch.bfloat16,
}


def torch_dtype(elem_type: int) -> torch.dtype:
    try:
        return DTYPES[elem_type]
    except KeyError:
        import onnx
        raise OpError(f"element type {onnx.TensorProto.DataType.Name(elem_type)} has no torch "
                      "equivalent") from None


class NodeInfo:
    """What an implementation may read about its node: attributes, opset, wanted outputs."""

    __slots__ = ("name", "op_type", "attrs", "opset", "outputs")

    def __init__(self, name: str, op_type: str, attrs: dict, opset: int, outputs: Sequence[str]):
        self.name, self.op_type, self.attrs, self.opset = name, op_type, attrs, opset
        self.outputs = tuple(outputs)

    def attr(self, key: str, default=None):
        return self.attrs.get(key, default)

    def wants(self, index: int) -> bool:
        """Whether output `index` is used (ONNX leaves optional outputs out or names them '')."""
        return index < len(self.outputs) and self.outputs[index] != ""


@dataclass(frozen=True)
class OpSpec:
    fn: Callable[..., object]
    static: frozenset[int] = frozenset()
    diff: frozenset[int] | None = None   # None: every input
    shape_only: bool = False
    random: bool = False

    def differentiable(self, position: int) -> bool:
        return self.diff is None or position in self.diff


OPS: dict[str, OpSpec] = {}


def op(*names: str, static: Sequence[int] = (), diff: Sequence[int] | None = None,
       shape_only: bool = False, random: bool = False):
    """Register `fn(node: NodeInfo, *inputs)` as the implementation of the ONNX ops `names`."""
    def register(fn):
        for name in names:
            assert name not in OPS, f"ONNX op {name} registered twice"
            OPS[name] = OpSpec(fn, frozenset(static), None if diff is None else frozenset(diff),
                               shape_only, random)
        return fn
    return register


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _scalar(value) -> int | float:
    """A static input that holds one number, as a 0-d or a 1-element tensor."""
    return value[0] if isinstance(value, list) else value


# ---------------------------------------------------------------- elementwise

_UNARY = {
    "Relu": torch.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Exp": torch.exp,
    "Log": torch.log, "Sqrt": torch.sqrt, "Neg": torch.neg, "Abs": torch.abs, "Erf": torch.erf,
    "Reciprocal": torch.reciprocal, "Sin": torch.sin, "Cos": torch.cos, "Tan": torch.tan,
    "Asin": torch.asin, "Acos": torch.acos, "Atan": torch.atan, "Sinh": torch.sinh,
    "Cosh": torch.cosh, "Floor": torch.floor, "Ceil": torch.ceil, "Round": torch.round,
    "Sign": torch.sign, "Softsign": F.softsign, "Softplus": F.softplus, "Mish": F.mish,
    "HardSwish": F.hardswish, "IsNaN": torch.isnan, "Not": torch.logical_not,
}


def _unary(fn):
    return lambda node, x: fn(x)


for _name, _fn in _UNARY.items():
    op(_name)(_unary(_fn))


@op("Identity")
def _identity(node, x):
    return x


@op("IsInf")
def _isinf(node, x):
    neg, pos = node.attr("detect_negative", 1), node.attr("detect_positive", 1)
    if neg and pos:
        return torch.isinf(x)
    return torch.isneginf(x) if neg else torch.isposinf(x) if pos else torch.zeros_like(x, dtype=torch.bool)


@op("Elu")
def _elu(node, x):
    return F.elu(x, node.attr("alpha", 1.0))


@op("Celu")
def _celu(node, x):
    return F.celu(x, node.attr("alpha", 1.0))


@op("LeakyRelu")
def _leaky_relu(node, x):
    return F.leaky_relu(x, node.attr("alpha", 0.01))


@op("Selu")
def _selu(node, x):
    alpha, gamma = node.attr("alpha", 1.67326319217681884765625), node.attr("gamma", 1.05070102214813232421875)
    return gamma * torch.where(x > 0, x, alpha * torch.expm1(x))


@op("HardSigmoid")
def _hard_sigmoid(node, x):
    return torch.clamp(node.attr("alpha", 0.2) * x + node.attr("beta", 0.5), 0, 1)


@op("ThresholdedRelu")
def _thresholded_relu(node, x):
    return torch.where(x > node.attr("alpha", 1.0), x, torch.zeros((), dtype=x.dtype, device=x.device))


@op("Gelu")
def _gelu(node, x):
    return F.gelu(x, approximate=node.attr("approximate", "none"))


@op("PRelu")
def _prelu(node, x, slope):
    return torch.where(x < 0, x * slope, x)


def _div(a, b):
    if a.is_floating_point() or a.is_complex():
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")  # ONNX integer division truncates


def _pow(a, b):
    """ONNX's Pow has its base's type; torch promotes (an int64 base with a float exponent
    gave float32, refused by the shape check as an op table bug)."""
    y = torch.pow(a, b)
    return y if y.dtype == a.dtype else y.to(a.dtype)


_BINARY = {
    "Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": _div, "Pow": _pow,
    "Equal": torch.eq, "Less": torch.lt, "LessOrEqual": torch.le, "Greater": torch.gt,
    "GreaterOrEqual": torch.ge, "And": torch.logical_and, "Or": torch.logical_or,
    "Xor": torch.logical_xor, "BitwiseAnd": torch.bitwise_and, "BitwiseOr": torch.bitwise_or,
}
_NOT_DIFFERENTIABLE = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or",
                       "Xor", "BitwiseAnd", "BitwiseOr"}


def _binary(fn):
    return lambda node, a, b: fn(a, b)


for _name, _fn in _BINARY.items():
    op(_name, diff=() if _name in _NOT_DIFFERENTIABLE else None)(_binary(_fn))


@op("Mod")
def _mod(node, a, b):
    return torch.fmod(a, b) if node.attr("fmod", 0) else torch.remainder(a, b)


def _variadic(fn):
    def run(node, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out
    return run


op("Sum")(_variadic(torch.add))
op("Max")(_variadic(torch.maximum))
op("Min")(_variadic(torch.minimum))


@op("Mean")
def _mean(node, *xs):
    return _variadic(torch.add)(node, *xs) / len(xs)


@op("Where", diff=(1, 2))
def _where(node, condition, x, y):
    return torch.where(condition, x, y)


@op("Clip", static=(1, 2), diff=(0,))
def _clip(node, x, low=None, high=None):
    if low is None and high is None:
        return x
    return torch.clamp(x, None if low is None else _scalar(low), None if high is None else _scalar(high))


@op("Cast", diff=(0,))
def _cast(node, x):
    return x.to(torch_dtype(node.attr("to")))


@op("CastLike", diff=(0,))
def _cast_like(node, x, like):
    return x.to(like.dtype)


# ---------------------------------------------------------------- linear algebra

@op("MatMul")
def _matmul(node, a, b):
    return torch.matmul(a, b)


@op("Gemm")
def _gemm(node, a, b, c=None):
    if node.attr("transA", 0):
        a = a.t()
    if node.attr("transB", 0):
        b = b.t()
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    if c is None:
        y = torch.mm(a, b)
        return y if alpha == 1 else alpha * y
    return torch.addmm(c, a, b, beta=beta, alpha=alpha)  # what nn.Linear runs: same rounding


@op("Einsum")
def _einsum(node, *xs):
    return torch.einsum(node.attr("equation"), *xs)


# ---------------------------------------------------------------- convolution and pooling

def _spatial_pads(node, spatial: Sequence[int], kernel: Sequence[int], strides, dilations):
    """(begin, end) padding per spatial axis, from `pads` or `auto_pad`."""
    n = len(spatial)
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = list(node.attr("pads", [0] * (2 * n)))
        return pads[:n], pads[n:]
    if auto == "VALID":
        return [0] * n, [0] * n
    begin, end = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begin.append(small if auto == "SAME_UPPER" else big)
        end.append(big if auto == "SAME_UPPER" else small)
    return begin, end


def _torch_pad(begin: Sequence[int], end: Sequence[int]) -> list[int]:
    """F.pad's order (last axis first) for per-axis (begin, end) pads."""
    out = []
    for b, e in zip(reversed(begin), reversed(end)):
        out += [b, e]
    return out


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


@op("Conv")
def _conv(node, x, w, b=None):
    n = x.dim() - 2
    if n not in _CONV:
        raise OpError(f"{n}-d convolution (1-d to 3-d are supported)")
    kernel = list(w.shape[2:])
    strides = node.attr("strides", [1] * n)
    dilations = node.attr("dilations", [1] * n)
    begin, end = _spatial_pads(node, x.shape[2:], kernel, strides, dilations)
    if begin != end:
        x, padding = F.pad(x, _torch_pad(begin, end)), 0
    else:
        padding = begin
    return _CONV[n](x, w, b, strides, padding, dilations, node.attr("group", 1))


@op("ConvTranspose")
def _conv_transpose(node, x, w, b=None):
    n = x.dim() - 2
    if n not in _CONV_T:
        raise OpError(f"{n}-d transposed convolution (1-d to 3-d are supported)")
    group = node.attr("group", 1)
    kernel = list(w.shape[2:])
    strides = node.attr("strides", [1] * n)
    dilations = node.attr("dilations", [1] * n)
    out_pad = list(node.attr("output_padding", [0] * n))
    full = [(size - 1) * s + (k - 1) * d + 1 for size, s, k, d in zip(x.shape[2:], strides, kernel, dilations)]
    output_shape = node.attr("output_shape")
    auto = node.attr("auto_pad", "NOTSET")
    if output_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        target = (list(output_shape)[-n:] if output_shape is not None
                  else [size * s for size, s in zip(x.shape[2:], strides)])
        total = [f + op_ - t for f, op_, t in zip(full, out_pad, target)]
        if output_shape is None:
            # SAME asks for input * stride where that is at most the full output; a kernel
            # smaller than the stride gives less, which onnxruntime (and shape inference)
            # leave unpadded: the output is the full one (was padded up, refused as an op
            # table bug by the shape check).
            total = [max(0, t) for t in total]
        # The spec's split: the smaller half first for SAME_UPPER only, else (NOTSET with
        # an output_shape, SAME_LOWER) the larger. A negative total (an output larger
        # than the full one) is zeros at the end, as onnxruntime pads it in every mode.
        # Unset was split as SAME_UPPER and negative totals halved: outputs one position
        # off onnxruntime's, 6.4 apart (found by a review).
        upper = auto == "SAME_UPPER"
        begin = [0 if t < 0 else t // 2 if upper else t - t // 2 for t in total]
        end = [t - bg for t, bg in zip(total, begin)]
    elif auto == "VALID":
        begin, end = [0] * n, [0] * n
    else:
        pads = list(node.attr("pads", [0] * (2 * n)))
        begin, end = pads[:n], pads[n:]
    if begin == end and all(p < max(s, d) for p, s, d in zip(out_pad, strides, dilations)):
        return _CONV_T[n](x, w, b, strides, begin, out_pad, group, dilations)
    y = _CONV_T[n](x, w, None, strides, 0, 0, group, dilations)
    y = F.pad(y, _torch_pad([-bg for bg in begin], [op_ - e for op_, e in zip(out_pad, end)]))
    return y if b is None else y + b.reshape(1, -1, *[1] * n)


def _pool_geometry(node, x):
    n = x.dim() - 2
    kernel = list(node.attr("kernel_shape"))
    strides = list(node.attr("strides", [1] * n))
    dilations = list(node.attr("dilations", [1] * n))
    begin, end = _spatial_pads(node, x.shape[2:], kernel, strides, dilations)
    return n, kernel, strides, dilations, begin, end


def _pooled_sizes(spatial, kernel, strides, dilations, begin, end, ceil: bool) -> list[int]:
    """The output's spatial sizes as ONNX defines them: with `ceil_mode`, a window that
    would start in the right padding is left out (as torch does for its own symmetric
    padding, which it takes to be `begin`)."""
    sizes = []
    for size, k, s, d, b, e in zip(spatial, kernel, strides, dilations, begin, end):
        span = size + b + e - (k - 1) * d - 1
        out = (-(-span // s) if ceil else span // s) + 1
        if ceil and (out - 1) * s >= size + b:
            out -= 1
        sizes.append(out)
    return sizes


def _windows_in_the_input(y: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """`y`, pooled from an explicitly padded input with `ceil_mode`, without the windows
    that start in the right padding. Pooling the padded tensor with no padding of its own,
    torch kept them (its rule sees no padding): a max over padding alone was -inf, an
    average 0/0 or over fewer values, where onnxruntime has no such window (found by a
    review)."""
    n = len(sizes)
    for axis, size in enumerate(sizes):
        y = y.narrow(y.dim() - n + axis, 0, size)
    return y


_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


@op("MaxPool")
def _max_pool(node, x):
    n, kernel, strides, dilations, begin, end = _pool_geometry(node, x)
    if n not in _MAX_POOL:
        raise OpError(f"{n}-d max pooling (1-d to 3-d are supported)")
    if node.attr("storage_order", 0):
        raise OpError("storage_order=1 (column-major indices)")
    ceil = bool(node.attr("ceil_mode", 0))
    if begin == end and all(p <= k // 2 for p, k in zip(begin, kernel)):
        padding = begin
    else:
        x, padding = F.pad(x, _torch_pad(begin, end), value=-math.inf), 0
    want_indices = node.wants(1)
    result = _MAX_POOL[n](x, kernel, strides, padding, dilations, ceil_mode=ceil,
                          return_indices=want_indices)
    if not want_indices:
        if ceil and padding == 0:
            return _windows_in_the_input(result, _pooled_sizes(
                [size - b - e for size, b, e in zip(x.shape[2:], begin, end)],
                kernel, strides, dilations, begin, end, ceil))
        return result
    y, indices = result
    if begin != end or any(begin):
        raise OpError("MaxPool's Indices output with padding")
    # torch numbers positions within each (N, C) plane; ONNX over the whole tensor.
    plane = math.prod(x.shape[2:])
    offsets = torch.arange(x.shape[0] * x.shape[1], device=x.device).reshape(
        x.shape[0], x.shape[1], *[1] * n) * plane
    return y, indices + offsets


@op("AveragePool")
def _average_pool(node, x):
    n, kernel, strides, dilations, begin, end = _pool_geometry(node, x)
    if n not in _AVG_POOL:
        raise OpError(f"{n}-d average pooling (1-d to 3-d are supported)")
    if any(d != 1 for d in dilations):
        raise OpError("dilated average pooling")
    ceil = bool(node.attr("ceil_mode", 0))
    include = bool(node.attr("count_include_pad", 0))
    pool = _AVG_POOL[n]
    if begin == end and all(p <= k // 2 for p, k in zip(begin, kernel)):
        return pool(x, kernel, strides, begin, ceil_mode=ceil, count_include_pad=include)
    padded = F.pad(x, _torch_pad(begin, end))
    y = pool(padded, kernel, strides, 0, ceil_mode=ceil, count_include_pad=True)
    if not include:
        ones = F.pad(torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype, device=x.device), _torch_pad(begin, end))
        y = y / pool(ones, kernel, strides, 0, ceil_mode=ceil, count_include_pad=True)
    if not ceil:
        return y
    return _windows_in_the_input(y, _pooled_sizes(x.shape[2:], kernel, strides, dilations, begin, end, ceil))


@op("GlobalAveragePool")
def _global_average_pool(node, x):
    return x.mean(dim=tuple(range(2, x.dim())), keepdim=True)


@op("GlobalMaxPool")
def _global_max_pool(node, x):
    return x.amax(dim=tuple(range(2, x.dim())), keepdim=True)


@op("LRN")
def _lrn(node, x):
    """Local response normalization across channels. The window sums come from one
    average pool over the padded squares (as `F.local_response_norm` does, but with
    ONNX's padding, which differs for even sizes): one op whose backward is one op. An
    unfold-and-sum formulation made more first-layer-sized temporaries in the backward,
    which kept AlexNet above half its store-everything peak at every batch."""
    size = node.attr("size")
    alpha, beta, bias = node.attr("alpha", 1e-4), node.attr("beta", 0.75), node.attr("bias", 1.0)
    front, back = (size - 1) // 2, size - 1 - (size - 1) // 2
    squares = (x * x).reshape(x.shape[0], 1, x.shape[1], -1, 1)     # (N, 1, C, rest, 1)
    squares = F.pad(squares, [0, 0, 0, 0, front, back])
    means = F.avg_pool3d(squares, (size, 1, 1), stride=1).reshape(x.shape)
    return x / (bias + alpha * means) ** beta


# ---------------------------------------------------------------- normalization

@op("BatchNormalization", diff=(0, 1, 2))
def _batch_norm(node, x, scale, bias, mean, var):
    eps = node.attr("epsilon", 1e-5)
    if not node.attr("training_mode", 0):
        if not (mean.requires_grad or var.requires_grad):
            return F.batch_norm(x, mean, var, scale, bias, False, 0.0, eps)
        # Statistics computed from trained tensors (the legacy exporter reads equal
        # initializers once: a fresh norm's variance is its weight, its mean its bias): the
        # same formula, differentiable in them, which torch's kernel refused (hunt68).
        shape = (1, -1) + (1,) * (x.dim() - 2)
        return ((x - mean.reshape(shape)) * torch.rsqrt(var.reshape(shape) + eps) * scale.reshape(shape)
                + bias.reshape(shape))
    y = F.batch_norm(x, None, None, scale, bias, True, 0.0, eps)
    if not (node.wants(1) or node.wants(2)):
        return y
    momentum = node.attr("momentum", 0.9)
    dims = [0] + list(range(2, x.dim()))
    batch_mean, batch_var = x.mean(dims), x.var(dims, unbiased=False)
    return y, mean * momentum + batch_mean * (1 - momentum), var * momentum + batch_var * (1 - momentum)


@op("InstanceNormalization")
def _instance_norm(node, x, scale, bias):
    return F.instance_norm(x, weight=scale, bias=bias, eps=node.attr("epsilon", 1e-5))


@op("LayerNormalization")
def _layer_norm(node, x, scale, bias=None):
    axis = _axis(node.attr("axis", -1), x.dim())
    eps = node.attr("epsilon", 1e-5)
    shape = tuple(x.shape[axis:])
    if tuple(scale.shape) == shape and (bias is None or tuple(bias.shape) == shape):
        y = F.layer_norm(x, shape, scale, bias, eps)
    else:  # Scale and B only broadcast to the normalized shape
        y = F.layer_norm(x, shape, None, None, eps) * scale
        y = y if bias is None else y + bias
    if not (node.wants(1) or node.wants(2)):
        return y
    dims = tuple(range(axis, x.dim()))
    mean = x.mean(dims, keepdim=True)
    inv_std = torch.rsqrt(x.var(dims, unbiased=False, keepdim=True) + eps)
    return y, mean, inv_std


@op("GroupNormalization")
def _group_norm(node, x, scale, bias):
    groups, eps = node.attr("num_groups"), node.attr("epsilon", 1e-5)
    channels = x.shape[1]
    if scale.shape[0] == channels:        # opset 21: one scale per channel
        return F.group_norm(x, groups, scale, bias, eps)
    per_channel = channels // groups      # opset 18: one scale per group
    shape = (1, channels) + (1,) * (x.dim() - 2)
    y = F.group_norm(x, groups, None, None, eps)
    return (y * scale.repeat_interleave(per_channel).reshape(shape)
            + bias.repeat_interleave(per_channel).reshape(shape))


@op("Softmax")
def _softmax(node, x):
    return torch.softmax(x, node.attr("axis", -1))


@op("LogSoftmax")
def _log_softmax(node, x):
    return torch.log_softmax(x, node.attr("axis", -1))


@op("Dropout", static=(1, 2), diff=(0,), random=True)
def _dropout(node, x, ratio=None, training_mode=None):
    ratio = 0.5 if ratio is None else float(_scalar(ratio))
    if not (training_mode is not None and _scalar(training_mode)) or ratio == 0:
        return (x, torch.ones_like(x, dtype=torch.bool)) if node.wants(1) else x
    if not node.wants(1):
        return F.dropout(x, ratio, True)
    keep = torch.rand_like(x) >= ratio
    return x * keep / (1 - ratio), keep


# ---------------------------------------------------------------- losses

def _ignore_index(node) -> int:
    return node.attr("ignore_index", -100)


@op("NegativeLogLikelihoodLoss", diff=(0,))
def _nll_loss(node, log_prob, target, weight=None):
    return F.nll_loss(log_prob, target, weight, ignore_index=_ignore_index(node),
                      reduction=node.attr("reduction", "mean"))


@op("SoftmaxCrossEntropyLoss", diff=(0,))
def _softmax_cross_entropy(node, scores, labels, weight=None):
    log_prob = torch.log_softmax(scores, 1)
    loss = F.nll_loss(log_prob, labels, weight, ignore_index=_ignore_index(node),
                      reduction=node.attr("reduction", "mean"))
    return (loss, log_prob) if node.wants(1) else loss


# ---------------------------------------------------------------- shapes and data movement

@op("Shape", diff=(), shape_only=True)
def _shape(node, x):
    dims = list(x.shape)
    start, end = node.attr("start", 0), node.attr("end", len(dims))
    return torch.tensor(dims[start:end], dtype=torch.int64)


@op("Size", diff=(), shape_only=True)
def _size(node, x):
    return torch.tensor(x.numel(), dtype=torch.int64)


@op("Constant", diff=())
def _constant(node):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        value = node.attr(key)
        if value is None:
            continue
        if isinstance(value, torch.Tensor):
            return value.clone()
        dtype = torch.float32 if key.startswith("value_float") else torch.int64
        return torch.tensor(value, dtype=dtype)
    raise OpError("a Constant without a numeric value (sparse and string constants are not supported)")


@op("ConstantOfShape", diff=())
def _constant_of_shape(node, shape):
    value = node.attr("value")
    fill = value.reshape(()) if value is not None else torch.tensor(0.0)
    return torch.full(tuple(int(d) for d in shape.tolist()), fill.item(), dtype=fill.dtype)


@op("Range", diff=())
def _range(node, start, limit, delta):
    return torch.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype)


@op("Reshape", static=(1,), diff=(0,))
def _reshape(node, x, shape):
    keep_zero = node.attr("allowzero", 0)
    target = [x.shape[i] if d == 0 and not keep_zero else d for i, d in enumerate(shape)]
    return x.reshape(target)


@op("Flatten", diff=(0,))
def _flatten(node, x):
    axis = _axis(node.attr("axis", 1), x.dim())
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


@op("Squeeze", static=(1,), diff=(0,))
def _squeeze(node, x, axes=None):
    axes = axes if axes is not None else node.attr("axes")
    if axes is None:
        return x.squeeze()
    return x.squeeze(tuple(_axis(a, x.dim()) for a in axes))


@op("Unsqueeze", static=(1,), diff=(0,))
def _unsqueeze(node, x, axes=None):
    axes = axes if axes is not None else node.attr("axes")
    rank = x.dim() + len(axes)
    for a in sorted(_axis(a, rank) for a in axes):
        x = x.unsqueeze(a)
    return x


@op("Transpose", diff=(0,))
def _transpose(node, x):
    perm = node.attr("perm") or list(reversed(range(x.dim())))
    return x.permute(perm)


@op("DepthToSpace", diff=(0,))
def _depth_to_space(node, x):
    """Channels into blocks of space (`nn.PixelShuffle` exports as mode CRD)."""
    b = node.attr("blocksize")
    n, c, h, w = x.shape
    if node.attr("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


@op("SpaceToDepth", diff=(0,))
def _space_to_depth(node, x):
    b = node.attr("blocksize")
    n, c, h, w = x.shape
    return x.reshape(n, c, h // b, b, w // b, b).permute(0, 3, 5, 1, 2, 4).reshape(n, c * b * b, h // b, w // b)


@op("Concat")
def _concat(node, *xs):
    return torch.cat(xs, node.attr("axis"))


@op("Split", static=(1,), diff=(0,))
def _split(node, x, split=None):
    axis = _axis(node.attr("axis", 0), x.dim())
    split = split if split is not None else node.attr("split")
    if split is None:
        parts = node.attr("num_outputs") or len(node.outputs)
        split = -(-x.shape[axis] // parts)  # the last part is smaller when uneven
    return tuple(torch.split(x, split, axis))


def _slice_bounds(size: int, start: int, end: int, step: int) -> tuple[int, int]:
    """ONNX Slice clamping of (start, end) for one axis."""
    if start < 0:
        start += size
    if end < 0:
        end += size
    if step > 0:
        return min(max(start, 0), size), min(max(end, 0), size)
    # Stepping back, start is clamped into [0, size - 1] and end into [-1, size - 1]. Start
    # clamped to -1 too made a start before the first element (-100 on 5) an empty slice
    # where onnxruntime takes the first (found by a review: silent where the starts are
    # computed, as shape inference then cannot check them).
    return min(max(start, 0), size - 1), min(max(end, -1), size - 1)


@op("Slice", static=(1, 2, 3, 4), diff=(0,))
def _slice(node, x, starts, ends, axes=None, steps=None):
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = _axis(axis, x.dim())
        size = x.shape[axis]
        start, end = _slice_bounds(size, start, end, step)
        if step > 0:
            index = [slice(None)] * axis + [slice(start, end, step)]
            x = x[tuple(index)]
        else:  # torch slices forward only: flip, then slice forward
            flipped = x.flip(axis)
            first, stop = size - 1 - start, size - 1 - end
            index = [slice(None)] * axis + [slice(first, max(stop, first), -step)]
            x = flipped[tuple(index)]
    return x


def _positive(indices: torch.Tensor, size: int) -> torch.Tensor:
    """ONNX indices may count from the end."""
    return torch.where(indices < 0, indices + size, indices)


@op("Gather", diff=(0,))
def _gather(node, x, indices):
    axis = _axis(node.attr("axis", 0), x.dim())
    indices = _positive(indices, x.shape[axis])
    if axis == 0 and x.dim() == 2 and x.is_floating_point():
        return F.embedding(indices, x)  # what nn.Embedding runs: the same backward
    flat = torch.index_select(x, axis, indices.reshape(-1))
    return flat.reshape(tuple(x.shape[:axis]) + tuple(indices.shape) + tuple(x.shape[axis + 1:]))


@op("GatherElements", diff=(0,))
def _gather_elements(node, x, indices):
    axis = _axis(node.attr("axis", 0), x.dim())
    return torch.gather(x, axis, _positive(indices, x.shape[axis]))


@op("GatherND", diff=(0,))
def _gather_nd(node, x, indices):
    b = node.attr("batch_dims", 0)
    k = indices.shape[-1]
    if b == 0:
        return x[tuple(indices[..., i] for i in range(k))]
    batch = math.prod(x.shape[:b])
    data = x.reshape(batch, *x.shape[b:])
    idx = indices.reshape(batch, -1, k)
    rows = torch.arange(batch, device=x.device).reshape(batch, 1).expand(batch, idx.shape[1])
    out = data[(rows,) + tuple(idx[..., i] for i in range(k))]
    return out.reshape(tuple(indices.shape[:-1]) + tuple(x.shape[b + k:]))


@op("ScatterElements", diff=(0, 2))
def _scatter_elements(node, x, indices, updates):
    axis = _axis(node.attr("axis", 0), x.dim())
    indices = _positive(indices, x.shape[axis])
    reduction = node.attr("reduction", "none")
    if reduction == "none":
        return torch.scatter(x, axis, indices, updates)
    if reduction == "add":
        return torch.scatter_add(x, axis, indices, updates)
    return torch.scatter_reduce(x, axis, indices, updates, {"mul": "prod", "max": "amax", "min": "amin"}[reduction])


@op("ScatterND", diff=(0, 2))
def _scatter_nd(node, x, indices, updates):
    reduction = node.attr("reduction", "none")
    if reduction not in ("none", "add"):
        raise OpError(f"ScatterND with reduction={reduction!r} (none and add are supported)")
    index = tuple(indices[..., i] for i in range(indices.shape[-1]))
    return torch.index_put(x, index, updates, accumulate=reduction == "add")


@op("Expand", static=(1,), diff=(0,))
def _expand(node, x, shape):
    return x.expand(torch.broadcast_shapes(tuple(x.shape), tuple(shape)))


@op("Tile", static=(1,), diff=(0,))
def _tile(node, x, repeats):
    return x.repeat(repeats)


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}


@op("Pad", static=(1, 2, 3), diff=(0,))
def _pad(node, x, pads, value=None, axes=None):
    mode = node.attr("mode", "constant")
    if mode not in _PAD_MODES:
        raise OpError(f"Pad mode {mode!r}")
    axes = list(range(x.dim())) if axes is None else [_axis(a, x.dim()) for a in axes]
    begin, end = [0] * x.dim(), [0] * x.dim()
    for i, a in enumerate(axes):
        begin[a], end[a] = pads[i], pads[len(axes) + i]
    first = next((a for a in range(x.dim()) if begin[a] or end[a]), x.dim())
    spec = _torch_pad(begin[first:], end[first:])
    if mode == "constant":
        return F.pad(x, spec, value=0 if value is None else _scalar(value))
    padded = x.dim() - first
    if padded == 0:
        return x
    # Crops come first: a mode that reads the input's values needs some left to read.
    if any(size + min(b, 0) + min(e, 0) < 1 for size, b, e in zip(x.shape, begin, end)):
        raise OpError(f"Pad by {pads} on shape {list(x.shape)}, which crops an axis to nothing")
    if mode == "reflect" and any(max(b, e) >= size - max(0, -b) - max(0, -e)
                                 for b, e, size in zip(begin, end, x.shape) if b > 0 or e > 0):
        raise OpError(f"Pad mode 'reflect' by {pads} on shape {list(x.shape)} (a reflection "
                      f"reaches at most the axis's size - 1 positions)")
    if padded <= 3 and x.dim() in (padded + 1, padded + 2) and min(begin + end) >= 0 \
            and all(max(b, e) <= size for size, b, e in zip(x.shape, begin, end)):
        return F.pad(x, spec, mode=_PAD_MODES[mode])
    # F.pad pads the last 1-3 axes of a tensor with 1-2 more in these modes: others (both
    # axes of a matrix, the batch axis) take each axis's positions as an index (refused
    # with F.pad's message and a wrong hint, found by a review). Negative pads crop
    # first, and the axis is padded as cropped, as onnxruntime does.
    for axis in range(first, x.dim()):
        crop_begin, crop_end = max(0, -begin[axis]), max(0, -end[axis])
        if crop_begin or crop_end:
            x = x.narrow(axis, crop_begin, x.shape[axis] - crop_begin - crop_end)
        if begin[axis] > 0 or end[axis] > 0:
            x = x.index_select(axis, _pad_positions(mode, x.shape[axis], max(0, begin[axis]),
                                                    max(0, end[axis]), x.device))
    return x


def _pad_positions(mode: str, size: int, begin: int, end: int, device) -> torch.Tensor:
    """The input positions a `mode` pad (reflect, edge, wrap) reads along one axis, in
    order, for pads of at least 0."""
    where = torch.arange(-begin, size + end, device=device)
    if mode == "edge":
        return where.clamp(0, size - 1)
    if mode == "wrap":
        return where.remainder(size)
    return torch.where(where < 0, -where, torch.where(where >= size, 2 * (size - 1) - where, where))


@op("CumSum", static=(1,), diff=(0,))
def _cumsum(node, x, axis):
    axis = _axis(int(_scalar(axis)), x.dim())
    if node.attr("reverse", 0):
        x = x.flip(axis)
    y = torch.cumsum(x, axis, dtype=x.dtype)
    if node.attr("exclusive", 0):
        y = F.pad(y.narrow(axis, 0, x.shape[axis] - 1), [0, 0] * (x.dim() - 1 - axis) + [1, 0])
    return y.flip(axis) if node.attr("reverse", 0) else y


@op("Trilu", static=(1,), diff=(0,))
def _trilu(node, x, k=None):
    k = 0 if k is None else int(_scalar(k))
    return torch.triu(x, k) if node.attr("upper", 1) else torch.tril(x, k)


@op("TopK", static=(1,), diff=(0,))
def _topk(node, x, k):
    k = int(_scalar(k))
    # ONNX puts the lower index first among equal values; torch.topk orders ties as its
    # kernel finds them (indices [1, 7, 5] where onnxruntime gives [1, 2, 3], found by a
    # review: a Gather of them, as MoE routing does, picks other rows). A stable sort
    # keeps them in index order, and is sorted as `sorted=0` allows.
    axis = node.attr("axis", -1)
    values, indices = torch.sort(x, dim=axis, descending=bool(node.attr("largest", 1)), stable=True)
    return values.narrow(axis, 0, k), indices.narrow(axis, 0, k)


@op("OneHot", static=(1, 2), diff=())
def _one_hot(node, indices, depth, values):
    depth = int(_scalar(depth))
    # An index outside [-depth, depth - 1] is a row of off values (F.one_hot raised).
    indices = indices.long()
    inside = (indices >= -depth) & (indices < depth)
    hot = F.one_hot(torch.where(inside, _positive(indices, depth), 0), depth) * inside.unsqueeze(-1)
    off, on = values
    out = torch.where(hot == 1, on, off).to(torch.float32 if isinstance(on, float) else torch.int64)
    return out.movedim(-1, _axis(node.attr("axis", -1), indices.dim() + 1))


@op("NonZero", diff=())
def _nonzero(node, x):
    return torch.nonzero(x).t().contiguous()


# ---------------------------------------------------------------- reductions

def _reduce(fn, multi_dim: bool = True, elementwise=None):
    """A Reduce* op: `axes` is an input from opset 18 (13 for ReduceSum), an attribute before.
    `elementwise`: what the op computes over no axis (`noop_with_empty_axes` with none
    given), where that is not `x` itself: a composite reduction still applies its
    elementwise steps (ReduceSumSquare gives x * x). Returning `x` for every op was
    silently wrong for those (found by a review)."""
    def run(node, x, axes=None):
        axes = axes if axes is not None else node.attr("axes")
        keep = bool(node.attr("keepdims", 1))
        if not axes:
            if node.attr("noop_with_empty_axes", 0):
                return x if elementwise is None else elementwise(x)
            axes = list(range(x.dim()))
        axes = sorted(_axis(a, x.dim()) for a in axes)
        if multi_dim:
            return fn(x, axes, keep)
        for a in reversed(axes):  # ops that take one dim at a time
            x = fn(x, a, keep)
        return x
    return run


_REDUCE = {
    "ReduceSum": (lambda x, d, k: torch.sum(x, d, keepdim=k), True, None),
    "ReduceMean": (lambda x, d, k: torch.mean(x, d, keepdim=k), True, None),
    "ReduceMax": (lambda x, d, k: torch.amax(x, d, keepdim=k), True, None),
    "ReduceMin": (lambda x, d, k: torch.amin(x, d, keepdim=k), True, None),
    "ReduceProd": (lambda x, d, k: torch.prod(x, d, keepdim=k), False, None),
    "ReduceL1": (lambda x, d, k: torch.linalg.vector_norm(x, 1, d, keepdim=k), True, torch.abs),
    "ReduceL2": (lambda x, d, k: torch.linalg.vector_norm(x, 2, d, keepdim=k), True, torch.abs),
    "ReduceSumSquare": (lambda x, d, k: torch.sum(x * x, d, keepdim=k), True, lambda x: x * x),
    "ReduceLogSum": (lambda x, d, k: torch.log(torch.sum(x, d, keepdim=k)), True, torch.log),
    "ReduceLogSumExp": (lambda x, d, k: torch.logsumexp(x, d, keepdim=k), True, None),
}
for _name, (_fn, _multi, _elementwise) in _REDUCE.items():
    op(_name, static=(1,), diff=(0,))(_reduce(_fn, _multi, _elementwise))


def _arg(fn):
    def run(node, x):
        axis = _axis(node.attr("axis", 0), x.dim())
        keep = bool(node.attr("keepdims", 1))
        if node.attr("select_last_index", 0):
            flipped = fn(x.flip(axis), axis, keep)
            return x.shape[axis] - 1 - flipped
        return fn(x, axis, keep)
    return run


op("ArgMax", diff=())(_arg(torch.argmax))
op("ArgMin", diff=())(_arg(torch.argmin))


# Resize, LSTM and GRU register themselves from modules of their own (they import this one).
importlib.import_module(".onnx_resize", __package__)
importlib.import_module(".onnx_recurrent", __package__)
