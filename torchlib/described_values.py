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
import collections.abc
import decimal
import enum
import fractions
import functools
import hashlib
import sys
import types

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
#: The key under which a dict's keys, in their order, are recorded among its items: a
#: forward iterating it follows that order (hunt83 F2: a dict re-ordered after `remat`
#: ran in the traced order, 0.44 off, silently).
ORDER = "order"
#: The key under which a container too long to record item by item is recorded among
#: its items, by `values_digest`.
DIGEST = "digest"
#: The most values `values_digest` digests: hashed at every call that reads it, a list of
#: 200,000 numbers cost 6 ms a step (hunt60); a longer container is not compared.
DIGESTED_AT_MOST = 16384
#: The key of a recorded method of a global object: {FUNCTION: its description}
#: (`torchlib.callables.describe`, which shows what the object holds).
FUNCTION = "function"
#: The key of a recorded tensor known by its metadata alone, {TENSOR_LIKE: [shape, dtype,
#: device]}: what a forward's stores leave on a module (`frontends/stored_tensors.py`),
#: whose values the graph does not read.
TENSOR_LIKE = "tensor like"


def values_digest(container) -> str | None:
    """A digest of what a list, tuple or dict too long to record item by item holds, the
    same in every process; None for anything else, or one holding more than
    `DIGESTED_AT_MOST` values. A schedule of 2,000 learning rates read by step, a dict
    `{step: lr}` or `{"class5": weight}`, a list of `(lr, momentum)` pairs or of lists, a
    hook's 300 per-layer configs: one item changed after `remat` trained on with the
    traced value, silently (found by hunt51 and hunt60). A list of numbers is digested by
    their bits (each as the float it is: -0.0 is not 0.0; integers as 64-bit integers, ids
    past 2**53 are not doubles), about 0.3 ms for 2,000 of them; anything else by
    `_digest_text`. A dict whose keys are 0, 1, ... in order digests as the list of its
    values (the runtime sees a list's items by index). Tensors, functions and modules
    inside are not part of it: elsewhere they are compared apart, or not at all. Python
    functions and partials are, by their code and what their closure, defaults and
    arguments hold (`_function_text`), and builtin functions by their names."""
    if isinstance(container, collections.abc.Mapping):
        if all(type(key) is int and key == at for at, key in enumerate(container)):
            container = list(container.values())
        else:
            container = dict(container)
    elif isinstance(container, (list, tuple)):   # as the runtime sees it by index (hunt62: a tuple never matched)
        container = list(container)
    if not isinstance(container, (list, dict)) or len(container) > DIGESTED_AT_MOST:
        return None
    kinds = set(map(type, container.values() if isinstance(container, dict) else container))
    if types.ModuleType in kinds:   # a namespace (`sys.modules[__name__]`), which grows at every import
        return None
    if isinstance(container, dict):
        kinds = {dict}
    if kinds <= {bool, int, float}:
        try:
            packed = array.array("q" if kinds <= {int, bool} else "d", container).tobytes()
        except (TypeError, OverflowError, ValueError):
            packed = None
        if packed is not None:
            return f"{len(container)} numbers #{hashlib.blake2b(packed, digest_size=16).hexdigest()}"
    plain = _plain_tree(container)
    if plain is None:
        return None
    if plain:   # builtin containers of plain values: their repr tells 1, 1.0 and True apart
        text = repr(container).encode("utf-8", "surrogatepass")
    else:
        parts: list[str] = []
        if not _digest_text(container, parts, [_OBJECTS_DIGESTED_AT_MOST], 0):
            return None
        text = "".join(parts).encode("utf-8", "surrogatepass")
    return f"{len(container)} items #{hashlib.blake2b(text, digest_size=16).hexdigest()}"


#: How deep `_digest_text` follows containers and objects inside a digested container.
_DIGEST_DEPTH = 4
#: The most values `_digest_text` visits: a dict of 2,000 small objects cost a step 11 ms
#: (hunt62); a container holding more is not compared.
_OBJECTS_DIGESTED_AT_MOST = 2048
_PLAIN_LEAVES = frozenset((bool, int, float, str, type(None)))
_BUILTIN_CONTAINERS = frozenset((list, tuple, dict))


def _plain_tree(container) -> bool | None:
    """Whether `container` holds only builtin lists, tuples and dicts of plain values,
    `_DIGEST_DEPTH` deep (then its repr is fast and names it: 0.1 ms for 300 items, where
    `_digest_text` takes ten times that); None where it holds more than
    `DIGESTED_AT_MOST` values."""
    left, plain, level = DIGESTED_AT_MOST, True, [container]
    for _ in range(_DIGEST_DEPTH):
        deeper = []
        for held in level:
            values = [*held.keys(), *held.values()] if type(held) is dict else held
            left -= len(values)
            if left < 0:
                return None
            for value in values:
                kind = type(value)
                if kind in _BUILTIN_CONTAINERS:
                    deeper.append(value)
                elif kind not in _PLAIN_LEAVES:
                    plain = False
        if not deeper:
            return plain
        level = deeper
    return False


def _slots(kind: type) -> tuple[str, ...]:
    """The names the `__slots__` of `kind` and its bases give (no `__dict__`, `__weakref__`)."""
    return tuple(name for klass in kind.__mro__ for name in (
        (klass.__dict__.get("__slots__", ()),) if isinstance(klass.__dict__.get("__slots__", ()), str)
        else klass.__dict__.get("__slots__", ())) if name not in ("__dict__", "__weakref__"))


def _digest_text(value, parts: list, budget: list, depth: int) -> bool:
    """Append to `parts` a text that tells `value` from any other a forward could compute
    otherwise with: plain values with their type (1, 1.0 and True are equal, and compute
    otherwise), described ones by `described`, containers item by item (a dict's keys in
    order), a plain object (a dataclass config) by its class and attributes, `_DIGEST_DEPTH`
    deep; anything else as "?". False where more than `budget` values were seen."""
    budget[0] -= 1
    if budget[0] < 0:
        return False
    kind = type(value)
    if kind in _PLAIN_LEAVES:   # its repr tells 1, 1.0, True and "1" apart
        parts.append(repr(value))
        return True
    if isinstance(value, (bool, int, float, str)) and not isinstance(value, enum.Enum):
        # A subclass's value (`class Lr(float)`), with its class: its `__dict__` is empty.
        parts.append(f"{kind.__qualname__}({value!r})")
        return True
    if isinstance(value, (list, tuple, dict)) and depth < _DIGEST_DEPTH:   # a named tuple's class too
        parts.append(f"{kind.__qualname__}{len(value)}(")
        for key, item in (value.items() if isinstance(value, dict) else enumerate(value)):
            if isinstance(value, dict) and not _digest_text(key, parts, budget, depth + 1):
                return False
            if not _digest_text(item, parts, budget, depth + 1):
                return False
        parts.append(")")
        return True
    if kind in (types.FunctionType, functools.partial) and depth < _DIGEST_DEPTH:
        return _function_text(value, parts, budget, depth)
    if kind is types.MethodType and depth < _DIGEST_DEPTH:   # `Obj(k).f`: its function and object
        parts.append("method:")
        return _function_text(value.__func__, parts, budget, depth) and _held_text(
            f"self:{type(value.__self__).__qualname__}", _state(value.__self__), parts, budget, depth)
    call = getattr(kind, "__call__", None)
    if isinstance(call, types.FunctionType) and depth < _DIGEST_DEPTH \
            and not isinstance(value, (torch.nn.Module, torch.Tensor, type)):
        # A callable object of a Python class: its class, `__call__`'s code, its state.
        return _held_text(f"callable:{kind.__module__}.{kind.__qualname__}:{_code_digest(call.__code__)}",
                          _state(value), parts, budget, depth)
    if kind is types.BuiltinFunctionType:   # `torch.tanh`, `math.exp`, a bound builtin method
        owner = getattr(value, "__self__", None)
        place = getattr(value, "__module__", None) or type(owner).__qualname__
        parts.append(f"builtin:{place}.{value.__qualname__};")
        return True
    state = _state(value)
    if type(state) is dict and depth < _DIGEST_DEPTH and not callable(value) \
            and not isinstance(value, (enum.Enum, torch.Tensor, type, types.ModuleType)):
        parts.append(f"object:{kind.__module__}.{kind.__qualname__}(")
        if all(type(item) in _PLAIN_LEAVES for item in state.values()):   # a config of plain values: faster
            budget[0] -= len(state)
            parts.append(repr(sorted(state.items())))
        else:
            for name in sorted(state):
                parts.append(f"{name}=")
                if not _digest_text(state[name], parts, budget, depth + 1):
                    return False
        parts.append(")")
        return budget[0] >= 0
    if (text := described(value)) is not None:
        parts.append(f"described:{len(text)}:{text};")
        return True
    parts.append("?;")
    return True


def _state(value) -> dict | None:
    """An object's attributes: its `__dict__`, or what its `__slots__` hold
    (`@dataclass(slots=True)`, hunt62); None for neither."""
    state = getattr(value, "__dict__", None)
    if type(state) is not dict and _slots(type(value)):
        state = {name: getattr(value, name) for name in _slots(type(value)) if hasattr(value, name)}
    return state if type(state) is dict else None


def _held_text(label: str, state: dict | None, parts: list, budget: list, depth: int) -> bool:
    """`_digest_text` of what a bound method's object or a callable object holds, by
    `label`: its plain values and functions by name, anything else as "?" (as a closure's,
    `_function_text`). hunt65: a list of 300 bound methods (`Obj(k).f`) or callable
    objects picked by index, one swapped or its `k` changed after `remat`, trained on
    with the traced one, 2.5 off, silently."""
    parts.append(f"{label}(")
    for name in sorted(state or {}):
        parts.append(f"{name}=")
        if not _plain_or_function(state[name], parts, budget, depth):
            return False
    parts.append(")")
    return True


def _plain_or_function(item, parts: list, budget: list, depth: int) -> bool:
    """`_digest_text` of a plain value or a function; "?" for anything else. Plain values
    and functions only: an object a closure holds digested whole cost the budget of the
    container (hunt65: a list of 300 (rate, function) pairs went uncompared, a rate's
    change missed), planned again for an attribute no code read (450 ms a step), hashed
    numpy rows (62 ms a call), raised on a dead weak proxy."""
    if type(item) in _PLAIN_LEAVES or type(item) in (types.FunctionType, functools.partial,
                                                     types.BuiltinFunctionType):
        return _digest_text(item, parts, budget, depth + 1)
    parts.append("?;")
    return True


def _function_text(value, parts: list, budget: list, depth: int) -> bool:
    """`_digest_text` of a Python function (its name, its code, what its closure and
    defaults hold) or a partial (its function, arguments and keywords). Found by hunt62: a
    list of 300 functions the forward picks from by index (`FUNCS[self.i](h)`), one
    replaced after `remat`, trained on with the traced one, silently."""
    if isinstance(value, functools.partial):
        parts.append("partial(")
        held = [value.func, *value.args, *sorted(value.keywords.items())]
    else:
        parts.append(f"function:{value.__module__}.{value.__qualname__}:{_code_digest(value.__code__)}(")
        cells = []
        for cell in value.__closure__ or ():
            try:
                cells.append(cell.cell_contents)
            except ValueError:   # not bound yet
                cells.append(None)
        held = [*cells, *(value.__defaults__ or ()), *sorted((value.__kwdefaults__ or {}).items())]
    for item in held:
        if not _plain_or_function(item, parts, budget, depth):
            return False
    parts.append(")")
    return True


@functools.lru_cache(maxsize=4096)
def _code_digest(code: types.CodeType) -> str:
    """A digest of what `code` does, the same in every process: its bytecode, names and
    constants, nested code by its own digest (a code object's repr holds its address)."""
    text = repr((code.co_names, code.co_varnames, code.co_freevars, [_constant_text(c) for c in code.co_consts]))
    return hashlib.blake2b(code.co_code + text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def _constant_text(constant) -> str:
    """A code constant's text, the same in every process: a frozenset's items sorted (its
    repr follows the hash seed: hunt65, the plan cache missed across processes)."""
    if isinstance(constant, types.CodeType):
        return _code_digest(constant)
    if isinstance(constant, frozenset):
        return f"frozenset({sorted(map(_constant_text, constant))})"
    if isinstance(constant, tuple):
        return f"({', '.join(map(_constant_text, constant))},)"
    return repr(constant)


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
    if isinstance(value, (int, float, str)) and type(value) not in (bool, int, float, str):
        # A subclass's value (`class Lr(float)`), by it and its class: an object's empty
        # `__dict__` showed no change (hunt62: `m.f = Lr(2.0)` trained on with 1.0, silently).
        base = next(b for b in (int, float, str) if isinstance(value, b))
        kind = type(value)
        return f"{kind.__module__}.{kind.__qualname__}({base.__repr__(value)})"
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
