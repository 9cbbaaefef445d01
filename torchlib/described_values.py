"""Values a forward reads that are not plain (bool, int, float, str, None) but that tracing
bakes into the graph as surely: an enum member it branches on (`if self.mode is
Mode.SUM`), a numpy scalar it scales by (`self.temperature = np.float32(0.5)`), a dtype it
casts to (`x.to(self.compute_dtype)`). Changed after lowering, each trained on with the
traced value, silently, since only plain values were recorded
(`frontends/traced_reads.py`); they are recorded by a text that names them the same in
every process, `{DESCRIBED: text}`, which the runtime compares (`runtimes/traced_reads.py`)."""

from __future__ import annotations

import array
import collections
import decimal
import enum
import fractions
import hashlib
import sys

import torch

#: The key of a recorded value given by its description: {DESCRIBED: text}.
DESCRIBED = "described"
#: The key of a recorded container held in a container: {NESTED: [[key, value], ...]}
#: (`frontends/traced_reads.py` `plain_items`).
NESTED = "items"
#: The key of a recorded plain object held in a container: {ATTRIBUTES: [[name, value], ...]}
#: of its public attributes whose values are recorded (`self.d["k"].v`).
ATTRIBUTES = "attributes"
#: The name under which an object's public attribute names (a sorted list) are recorded
#: among its {ATTRIBUTES: ...}: one set later (`getattr(CFG, "k", 1.0)` read it as
#: absent) computes otherwise.
PUBLIC_NAMES = "__public_names__"
#: The key under which a container's length is recorded among its items.
LENGTH = "length"
#: The key under which a list or tuple of numbers too long to record item by item is
#: recorded among its items, by `numbers_digest`.
DIGEST = "digest"
#: The longest list `numbers_digest` digests: hashed at every call that reads it, a list of
#: 200,000 numbers cost 6 ms a step (hunt60); a longer one is not compared.
DIGESTED_AT_MOST = 16384
#: The key of a recorded method of a global object: {FUNCTION: its description}
#: (`torchlib.callables.describe`, which shows what the object holds).
FUNCTION = "function"
#: The key of a recorded tensor known by its metadata alone, {TENSOR_LIKE: [shape, dtype,
#: device]}: what a forward's stores leave on a module (`frontends/stored_tensors.py`),
#: whose values the graph does not read.
TENSOR_LIKE = "tensor like"


def numbers_digest(values) -> str | None:
    """A digest of the bits of a list or tuple of numbers (booleans, integers and floats,
    each as the float it is: -0.0 is not 0.0), the same in every process; None for any
    other container, or a longer one than `DIGESTED_AT_MOST`. For a schedule of more
    numbers than are recorded one by one (a table of 2,000 learning rates or noise levels
    read by step): one item changed after `remat` trained on with the traced value,
    silently (found by hunt51). About 0.3 ms for 2,000 numbers, hashed at every call that
    reads such a list."""
    if not isinstance(values, (list, tuple)) or len(values) > DIGESTED_AT_MOST:
        return None
    kinds = set(map(type, values))
    if not kinds <= {bool, int, float}:   # not tensors (a memory bank: hunt60), strings, lists
        return None
    try:   # integers as 64-bit integers (ids past 2**53 are not doubles), else as doubles
        packed = array.array("q" if kinds <= {int, bool} else "d", values).tobytes()
    except (TypeError, OverflowError, ValueError):
        return None
    return f"{len(values)} numbers #{hashlib.blake2b(packed, digest_size=16).hexdigest()}"


def tensor_like(shape, dtype: torch.dtype, device) -> dict:
    """A tensor's metadata as recorded under `TENSOR_LIKE`."""
    return {TENSOR_LIKE: [list(shape), str(dtype).removeprefix("torch."), str(torch.device(device))]}


def is_tensor_like(value, recorded: dict) -> bool:
    """Whether `value` is a tensor of the shape, dtype and device `recorded` holds."""
    shape, dtype, device = recorded[TENSOR_LIKE]
    return isinstance(value, torch.Tensor) and list(value.shape) == shape and \
        str(value.dtype).removeprefix("torch.") == dtype and str(value.device) == device


def described(value) -> str | None:
    """The text naming `value` where it is of a kind above, else None: an enum member by
    its class and name, a numpy scalar by its type and value, a dtype by its name; and the
    values of builtin types that are not plain but that a forward decides or computes with
    as surely (a review found each, changed after `remat`, trained on with the traced value,
    silently): an op of `torch.ops` (held in a table of activations), a set of
    flags (`"boost" in self.flags`), a `slice` it indexes with, a
    `range`, a `deque` of recent values, bytes, a complex, a `Fraction` or `Decimal`, a
    torch device, layout or memory format, and a numpy array (class weights passed to
    `torch.tensor`, a gain read by `float(self.gain[0])`) by its dtype, shape and a digest
    of its bytes (written in place, it is another value)."""
    if isinstance(value, enum.Enum):
        kind = type(value)
        return f"{kind.__module__}.{kind.__qualname__}.{value.name}"
    if isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return f"torch.ops.{value}"   # an op held in a table (`OPS["act"] = torch.ops.aten.tanh`)
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return str(value)
    kind = type(value)
    if kind in (complex, bytes, range, fractions.Fraction, decimal.Decimal):
        return f"{kind.__qualname__}({value!r})" if kind is not bytes or len(value) <= _INLINE_BYTES \
            else f"bytes({len(value)} #{hashlib.blake2b(value, digest_size=12).hexdigest()})"
    if kind is slice:
        parts = [_part(value.start), _part(value.stop), _part(value.step)]
        return None if None in parts else f"slice({', '.join(parts)})"
    if kind in (set, frozenset, collections.deque):
        parts = [_part(item) for item in value]
        if None in parts:
            return None
        if kind is collections.deque:   # in order, with its bound (it drops the oldest)
            return f"deque([{', '.join(parts)}], maxlen={value.maxlen})"
        return f"{kind.__qualname__}({{{', '.join(sorted(parts))}}})"   # no process's hashing orders it
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic):
        return f"numpy.{type(value).__name__}({value.item()!r})"
    if numpy is not None and kind is numpy.ndarray and not value.dtype.hasobject:
        data = numpy.ascontiguousarray(value).tobytes()
        return (f"numpy.ndarray({value.dtype}, {list(value.shape)} "
                f"#{hashlib.blake2b(data, digest_size=12).hexdigest()})")
    return None


#: Bytes longer than this are described by a digest (the metadata holds the text).
_INLINE_BYTES = 64


def _part(value) -> str | None:
    """An item of a set, deque or slice as `described` shows it: a plain value by its repr
    with its type (1, 1.0 and True are equal, and compute otherwise), else its own
    description; None where neither (the whole is then not recorded)."""
    if value is None or type(value) in (bool, int, float, str):
        return repr(value) if type(value) is not float else f"float({value!r})"
    if type(value) is tuple:   # a set of pairs (`{(0, 1), (2, 3)}`)
        parts = [_part(item) for item in value]
        return None if None in parts else f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
    return described(value)
