"""Node arguments: Python objects <-> `Argument` messages, losslessly.

An op is re-executed from its IR node alone, so its non-tensor arguments must
survive a round trip exactly: -inf in causal masks, NaN, integers beyond int64,
complex numbers (derivative formulas of complex ops multiply by 1j), dtypes, devices
and memory formats. The IR does not import torch, so the
torch-specific kinds have small stand-in types here; the runtime maps them to
torch objects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import remat_ir_pb2 as pb
from .dtypes import dtype_from_name, dtype_name

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class TensorRef:
    """A tensor argument: the id of the IR value passed in this position."""
    value_id: int


@dataclass(frozen=True)
class DTypeArg:
    """A dtype passed as an argument (`dtype=torch.float16`), by IR name."""
    name: str


@dataclass(frozen=True)
class Device:
    """A device passed as an argument ("cpu", "cuda:0")."""
    name: str


@dataclass(frozen=True)
class MemoryFormatArg:
    """A memory format passed as an argument, by IR enum name ("channels_last")."""
    name: str


@dataclass(frozen=True)
class LayoutArg:
    """A layout passed as an argument, by IR enum name ("strided")."""
    name: str


def encode(obj) -> pb.Argument:
    """Message for one Python argument; raises TypeError naming what is unsupported."""
    arg = pb.Argument()
    if obj is None:
        arg.none = True
    elif isinstance(obj, TensorRef):
        arg.tensor = obj.value_id
    elif isinstance(obj, bool):  # before int: bool is an int subclass
        arg.bool_value = obj
    elif isinstance(obj, int):
        if INT64_MIN <= obj <= INT64_MAX:
            arg.int_value = obj
        else:
            arg.big_int = str(obj)
    elif isinstance(obj, float):
        arg.float_value = obj
    elif isinstance(obj, complex):
        arg.complex_value.real, arg.complex_value.imag = obj.real, obj.imag
    elif isinstance(obj, str):
        arg.string_value = obj
    elif isinstance(obj, (list, tuple)):
        arg.list.is_tuple = isinstance(obj, tuple)
        arg.list.items.extend(encode(item) for item in obj)
        if not obj:
            arg.list.SetInParent()  # keep an empty list distinguishable from "unset"
    elif isinstance(obj, DTypeArg):
        arg.dtype = dtype_from_name(obj.name)
    elif isinstance(obj, Device):
        arg.device = obj.name
    elif isinstance(obj, MemoryFormatArg):
        arg.memory_format = pb.MemoryFormat.Value(obj.name.upper())
    elif isinstance(obj, LayoutArg):
        arg.layout = pb.Layout.Value(obj.name.upper())
    else:
        raise TypeError(f"cannot store an argument of type {type(obj).__name__} ({obj!r}) in the IR")
    return arg


def decode(arg: pb.Argument):
    """Python object for one argument message (inverse of `encode`)."""
    kind = arg.WhichOneof("kind")
    if kind is None:
        raise ValueError("argument has no value set")
    if kind == "none":
        return None
    if kind == "tensor":
        return TensorRef(arg.tensor)
    if kind == "list":
        items = [decode(item) for item in arg.list.items]
        return tuple(items) if arg.list.is_tuple else items
    if kind == "big_int":
        return int(arg.big_int)
    if kind == "complex_value":
        return complex(arg.complex_value.real, arg.complex_value.imag)
    if kind == "dtype":
        return DTypeArg(dtype_name(arg.dtype))
    if kind == "device":
        return Device(arg.device)
    if kind == "memory_format":
        return MemoryFormatArg(pb.MemoryFormat.Name(arg.memory_format).lower())
    if kind == "layout":
        return LayoutArg(pb.Layout.Name(arg.layout).lower())
    return getattr(arg, kind)  # int_value, float_value, bool_value, string_value


def tensor_ids(arg: pb.Argument):
    """Yield the value ids this argument refers to, in order (nested lists too)."""
    kind = arg.WhichOneof("kind")
    if kind == "tensor":
        yield arg.tensor
    elif kind == "list":
        for item in arg.list.items:
            yield from tensor_ids(item)


def same(a, b) -> bool:
    """Equality of decoded arguments where NaN equals NaN and -0.0 differs from 0.0 (for
    round-trip checks)."""
    if isinstance(a, float) and isinstance(b, float):
        return (a == b and math.copysign(1.0, a) == math.copysign(1.0, b)) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, complex) and isinstance(b, complex):
        return same(a.real, b.real) and same(a.imag, b.imag)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b
