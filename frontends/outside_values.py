"""Counters a forward keeps outside its modules, told from what its first call sets up.

A forward that advances a count in a global dict (`STATE["n"] += 1`), an attribute of a
global object (`CTR.n += 1`), a closure's list, a global of another of the user's files
(`stepper.next_step()`), or that draws from a global iterator or `random.Random`, ran it
once while tracing: the graph then computed every step with the value of that one call,
silently (0.15 to 0.47 off eager's; review AF, 2026-12-02). The same places also hold
what a first call sets up and leaves alone after (a warn-once set, a lazy probe, a
registry), which is no effect: eager's later calls see it as the graph does.

So the frontend takes a `Snapshot` of the plain values there before tracing and after,
and where the trace changed any, traces again from what it left, as eager's second call
would start: a value changed again is a counter, refused by name and put back; one
that settled is left as eager's first call leaves it (`frontends/torch.py` `_export`).

A snapshot reads containers through their base classes' methods (a subclass's may do
anything: transformers' lazy auto-mappings import every model when theirs run), small
numpy arrays and `array.array`s by value (`STEPS[0] += 1`), the attributes and closure
cells of the user's functions wherever they are held (a dict of callbacks, each counting in
its closure), and stops at `_BUDGET` values per global: a container bigger than what is
left (a dataset's list) by its length alone, and a counter deeper in a big structure is
not seen.
Tensors are not compared: one the trace left is a placeholder, which `outside_state`
refuses, and a cache of them is what the graph computes at every step.
"""
from __future__ import annotations

import argparse
import array
import collections
import contextlib
import dataclasses
import itertools
import sys
import types

import torch

from remat_ir.torchlib.generators import same_state

from .outside_state import generator_state, namespaces, restore_generator, users_object
from .model_lines import is_users_file
from .traced_reads import PLAIN_TYPES, plain

#: Values of one global looked at, containers' items and objects' attributes together.
_BUDGET = 2000
#: How deep in containers and objects. The budget bounds the cost, so depth only stops a
#: chain of nested containers: at 3, a counter 4 levels deep (`CFG["a"]["b"]["c"]["n"]`)
#: or an object's attribute in `[[[obj]]]` trained frozen at its traced value (review R5).
_DEPTH = 6
#: Numpy arrays up to this many elements are compared by value.
_ARRAY = 256
#: Globals compared by identity alone.
_CODE = (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType, torch.nn.Module)


@dataclasses.dataclass(slots=True)
class _Value:
    """What a snapshot saw of one value: `kind` says how `items` holds it."""

    value: object
    kind: str   # plain, state, array, sized, tensor, other, list, tuple, deque, dict, set, object, function
    items: object = None


#: Exact types read without the checks other values go through: a snapshot of a test
#: suite's or a notebook's globals is mostly these (this repository's tests: 9,000 values
#: in 2,720 globals, read at least twice per lowering).
_PLAIN = frozenset(PLAIN_TYPES)
#: Containers whose items are read, by the base class whose methods read them (a
#: subclass's own `__len__`/`__iter__` is not called).
_CONTAINERS = (list, tuple, collections.deque, dict)


def _seen(value, budget: list[int], depth: int = 0) -> _Value:
    budget[0] -= 1
    cls = type(value)
    if cls in _PLAIN and value == value:   # `plain`, first: most values are
        return _Value(value, "plain", value)
    if cls is list or cls is tuple or cls is dict:   # exactly: no generator, array or holder
        return _contained(value, cls, budget, depth)
    numpy = sys.modules.get("numpy")
    if isinstance(value, _CODE):   # most globals: by identity, quickly
        if isinstance(value, types.FunctionType) and (vars(value) or value.__closure__ and depth > 0) and \
                depth < _DEPTH and is_users_file(value.__code__.co_filename):
            # `count.calls += 1`; and its closure's cells where it is held in a container
            # (`BUMPERS["f"]()`; a global function's own are a namespace of their own).
            cells = _cells(value) if depth > 0 else {}
            return _Value(value, "function", [(key, _seen(item, budget, depth + 1))
                                              for key, item in [*list(vars(value).items()), *cells.items()]])
        return _Value(value, "other")
    if plain(value):
        return _Value(value, "plain", value)
    if isinstance(value, torch.Tensor):
        return _Value(value, "tensor")
    state = generator_state(value, numpy)
    if state is not None:
        return _Value(value, "state", state)
    if depth >= _DEPTH or budget[0] <= 0:
        return _Value(value, "other")
    if numpy is not None and isinstance(value, numpy.ndarray) and value.size <= _ARRAY:
        return _Value(value, "array", value.copy())   # `STEPS[0] += 1`
    if isinstance(value, array.array) and len(value) <= _ARRAY:
        return _Value(value, "array", array.array(value.typecode, value))
    for base in _CONTAINERS:
        if isinstance(value, base):
            return _contained(value, base, budget, depth)
    if isinstance(value, (set, frozenset)):
        base = set if isinstance(value, set) else frozenset
        if base.__len__(value) > budget[0]:   # its length alone
            return _Value(value, "sized", base.__len__(value))
        return _Value(value, "set", frozenset(item if plain(item) else id(item) for item in base.__iter__(value)))
    if _holder(value):
        return _Value(value, "object", [(key, _seen(item, budget, depth + 1)) for key, item in vars(value).items()])
    return _Value(value, "other")


def _contained(value, base: type, budget: list[int], depth: int) -> _Value:
    """A list's, tuple's, deque's or dict's items as `base` reads them; its length alone
    where they would pass the budget (a dataset's list)."""
    if depth >= _DEPTH or budget[0] <= 0:
        return _Value(value, "other")
    if base.__len__(value) > budget[0]:
        return _Value(value, "sized", base.__len__(value))
    if base is dict:
        return _Value(value, "dict", [(key, _seen(item, budget, depth + 1)) for key, item in dict.items(value)])
    return _Value(value, base.__name__, [_seen(item, budget, depth + 1) for item in base.__iter__(value)])


#: How a closure cell of a function is named among its items (no attribute is named so).
_CELL = "<closure {}>"


def _cells(function: types.FunctionType) -> dict[str, object]:
    """The contents of `function`'s filled closure cells, by `_CELL` name."""
    found = {}
    for name, cell in zip(function.__code__.co_freevars, function.__closure__ or ()):
        try:
            found[_CELL.format(name)] = cell.cell_contents
        except ValueError:   # an empty cell
            continue
    return found


def _holder(value) -> bool:
    """An object whose attributes are the user's values: one of the user's classes, a
    `SimpleNamespace`, an `argparse.Namespace` (`ARGS.step += 1`), a dataclass (a
    library's other objects keep their own bookkeeping)."""
    return users_object(value) or isinstance(value, (types.SimpleNamespace, argparse.Namespace)) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type) and hasattr(value, "__dict__"))


@dataclasses.dataclass
class _Change:
    """A global changed between two snapshots: `what` names it, `inside` the item or
    attribute of it that changed (`STATE['n']`); `before` and `after` are what the
    snapshots saw there, held at `key` of `parent` (a container's `_Value`; None: the
    global itself, `key` of the mapping `names`)."""

    what: str
    inside: str
    before: _Value
    after: _Value
    names: object
    parent: _Value | None
    key: object


def _difference(a: _Value, b: _Value, path: str, parent: _Value | None = None,
                key=None) -> tuple[str, _Value, _Value, _Value | None, object] | None:
    """(where in the value, as `path` and the items or attributes read from it; before;
    after; the container holding it and its key there) of the first change from `a` to
    `b`; None if none."""
    here = (path, a, b, parent, key)
    if a.kind != b.kind or a.kind in ("other", "function") and a.value is not b.value:
        return here
    if a.kind == "plain":
        return None if type(a.value) is type(b.value) and a.value == b.value else here
    if a.kind == "state":
        return None if same_state(a.items, b.items) else here
    if a.kind == "array" and isinstance(a.items, array.array):
        return None if type(b.items) is array.array and a.items.typecode == b.items.typecode and \
            a.items.tolist() == b.items.tolist() else here
    if a.kind == "array":
        import numpy

        same = type(b.items) is type(a.items) and a.items.shape == b.items.shape and \
            a.items.dtype == b.items.dtype and numpy.array_equal(a.items, b.items,
                                                                 equal_nan=a.items.dtype.kind in "fc")
        return None if same else here
    if a.kind in ("sized", "set"):
        return None if a.items == b.items else here
    if a.kind in ("tensor", "other"):   # a tensor: a placeholder or a cache (module docstring)
        return None
    if a.kind in ("dict", "object", "function"):
        if len(a.items) != len(b.items) or not all(_same_key(x, y) for (x, _), (y, _) in zip(a.items, b.items)):
            return here
        for (name, x), (_, y) in zip(a.items, b.items):
            inner = f"{path}[{name!r}]" if a.kind == "dict" else f"{path}.{name}"
            if (found := _difference(x, y, inner, a, name)) is not None:
                return found
        return None
    if len(a.items) != len(b.items):
        return here
    for i, (x, y) in enumerate(zip(a.items, b.items)):
        if (found := _difference(x, y, f"{path}[{i}]", a, i)) is not None:
            return found
    return None


def _same_key(a, b) -> bool:
    """Whether two dict keys are one (a tensor key compared with `==` would raise)."""
    if a is b:
        return True
    try:
        return type(a) is type(b) and not isinstance(a, torch.Tensor) and bool(a == b)
    except Exception:
        return False


def _shown(seen: _Value) -> str:
    count = len(seen.items) if seen.kind in ("list", "tuple", "deque", "dict", "set") else (
        seen.items if seen.kind == "sized" else None)
    text = repr(seen.value) if seen.kind == "plain" else repr(seen.items.tolist()) if seen.kind == "array" else (
        f"{count} item{'' if count == 1 else 's'}" if count is not None else f"a {type(seen.value).__name__}")
    return text if len(text) <= 60 else f"{text[:57]}..."


def put_back(changes: list[_Change]) -> None:
    """Each changed value where it was: a number, string or None set back where it is
    held, a generator's state set back, a small array refilled. A container that grew or
    shrank is left as it is (another thread's log lost its lines when it was cut back,
    review R5), and so is an iterator's position, which cannot be set."""
    for change in changes:
        before, parent, key = change.before, change.parent, change.key
        if before.kind == "state":
            restore_generator(before.value, before.items)
        elif before.kind == "array" and isinstance(before.items, array.array):
            if len(before.value) == len(before.items):
                before.value[:] = before.items
        elif before.kind == "array" and before.value.shape == before.items.shape:
            before.value[...] = before.items
        elif before.kind != "plain":
            continue
        elif parent is None:
            change.names[key] = before.value
        elif parent.kind == "function" and key in _cells(parent.value):
            free = [_CELL.format(name) for name in parent.value.__code__.co_freevars]
            parent.value.__closure__[free.index(key)].cell_contents = before.value
        elif parent.kind in ("object", "function"):
            vars(parent.value)[key] = before.value
        elif parent.kind == "dict" and dict.__contains__(parent.value, key):
            setter = (collections.OrderedDict.__setitem__ if isinstance(parent.value, collections.OrderedDict)
                      else dict.__setitem__)
            setter(parent.value, key, before.value)
        elif parent.kind in ("list", "deque") and key < type(parent.value).__len__(parent.value):
            type(parent.value).__setitem__(parent.value, key, before.value)


class Snapshot:
    """The plain values of the user's globals, their functions' closures and their classes'
    attributes, and of `model`'s module classes (`outside_state.namespaces`), as `_seen`
    reads them."""

    def __init__(self, model=None):
        self.values: dict[tuple[str, str], tuple[object, _Value]] = {}
        for where, names in namespaces(model):
            for key, value in list(names.items()):
                if isinstance(key, str) and not key.startswith("__"):
                    try:
                        self.values[(where, key)] = (names, _seen(value, [_BUDGET]))
                    except RuntimeError:   # changed by another thread as it was read: not the forward's
                        continue

    def changed(self, now: Snapshot) -> list[_Change]:
        """Each global changed from this snapshot to `now`."""
        found = []
        for (where, key), (names, before) in self.values.items():
            if (where, key) in now.values and (
                    difference := _difference(before, now.values[(where, key)][1], key)) is not None:
                inside, was, then, parent, at = difference
                found.append(_Change(where.format(repr(key)), inside, was, then, names, parent,
                                     key if parent is None else at))
        return found


@contextlib.contextmanager
def user_state_kept(model=None):
    """Within: work that runs the model's code and is no step of it (profiling, timing a
    plan, a custom op's trial run) leaves the plain values, generators and tensors of the
    user's globals, closures and class attributes as it found them (`put_back`). hunt65:
    `remat()` ran a custom op about 56 times, so one counting its calls in a global, or
    drawing from a generator of its own, started training elsewhere than eager (0.93 and
    0.35 off at the first step), silently; hunt67: so did one counting in a global tensor
    (`STEPS.add_(1)`, 0.25 off). Lowering's own traces are not inside: what a first call
    sets up and leaves settled is kept, as eager's first call keeps it."""
    before = Snapshot(model)
    held = _held(model, (torch.Generator, torch.Tensor))   # one walk of the user's places for both
    generators = {id(g): (g, g.get_state()) for g in held if isinstance(g, torch.Generator)}
    tensors = _tensor_copies([t for t in held if isinstance(t, torch.Tensor)])
    moved: list[str] = []   # what the work changed, said, for the caller (a custom op's trial)
    try:
        yield moved
    finally:
        changes = before.changed(Snapshot(model))
        put_back(changes)
        moved += [change.what for change in changes]
        for generator, state in generators.values():
            if not torch.equal(generator.get_state(), state):
                moved.append(f"a torch.Generator of the user's ({type(generator).__name__})")
                generator.set_state(state)
        for tensor, copy in tensors:
            if tensor.shape == copy.shape and tensor.dtype == copy.dtype and not _same_bits(tensor, copy):
                moved.append(f"a tensor of the user's ({tuple(tensor.shape)}, {tensor.dtype})")
                with torch.no_grad():
                    tensor.copy_(copy)


#: The most bytes of the user's tensors `user_state_kept` copies (a counter, a running
#: statistic or a small table, not a dataset a global holds).
_TENSOR_BYTES = 16 << 20


def _tensor_copies(found: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(tensor, a copy of its values) for the user's plain dense tensors, the smallest
    first, up to `_TENSOR_BYTES` in all (hunt69: a 16 MiB table met first left a counter
    after it uncopied; a sparse tensor raised, a quantized one crashed the process).
    Parameters are not the user's globals: a step changes them."""
    copies, left = [], _TENSOR_BYTES
    dense = [t for t in found if type(t) is torch.Tensor and t.layout == torch.strided and not t.is_meta
             and not t.is_quantized and not t.is_nested]
    for tensor in sorted(dense, key=lambda t: t.nbytes):
        if (size := tensor.nbytes) > left:
            break
        left -= size
        copies.append((tensor, tensor.detach().clone()))
    return copies


def _same_bits(tensor: torch.Tensor, copy: torch.Tensor) -> bool:
    """Whether `tensor` holds the bits of `copy` (a NaN left as it was is unchanged)."""
    return torch.equal(tensor.detach().contiguous().flatten().view(torch.uint8),
                       copy.contiguous().flatten().view(torch.uint8))


def _held(model, kind: type | tuple[type, ...]) -> list:
    """The values of type `kind` the user holds (a snapshot leaves generators and tensors
    to this): in the places `namespaces` gives, the model's modules' attributes, and the
    items of the lists, tuples and dicts and the attributes of the objects there."""
    places = [names.values() for _, names in namespaces(model)]
    places += [vars(module).values() for module in (model.modules() if model is not None else ())]
    found, seen = [], set()
    for values in places:
        for value in list(values):
            inside = (value.values() if type(value) is dict else value if type(value) in (list, tuple)
                      else vars(value).values() if _holder(value) else ())
            for item in (value, *itertools.islice(inside, 64)):
                if isinstance(item, kind) and id(item) not in seen:
                    seen.add(id(item))
                    found.append(item)
    return found


def counters(first: Snapshot, traced: Snapshot, again: Snapshot) -> list[tuple[_Change, str]]:
    """(the change, what the refusal says of it) for each global the first trace (from
    `first` to `traced`) and the second (from `traced` to `again`) both changed: a counter."""
    before = {change.what: change for change in first.changed(traced)}
    said = []
    for change in traced.changed(again):
        if change.what not in before:
            continue
        place = _place(change)
        if change.before.kind == "state":
            said.append((before[change.what], f"it draws from the {type(change.before.value).__name__} "
                                              f"in {place} at each call"))
        else:
            first_change = before[change.what]
            said.append((first_change, f"it changes {place} at each call ({_shown(first_change.before)}, "
                                       f"then {_shown(change.before)}, then {_shown(change.after)} "
                                       f"when traced again)"))
    return said


def _place(change: _Change) -> str:
    """The global, and the item or attribute of it that changed (`STATE['n']`)."""
    inside = change.inside
    return change.what if "[" not in inside and "." not in inside else f"{change.what} ({inside})"


def changes(first: Snapshot, now: Snapshot, computed_with: bool = False) -> list[tuple[_Change, str]]:
    """(the change, what the refusal says of it) for each global changed from `first` to
    `now`: by a custom autograd Function's backward, which is traced once, or, with
    `computed_with`, by a first trace whose forward computed with the value before
    (the second made another program: `frontends/torch.py`)."""
    return [(change, f"it changes {_place(change)} after computing with it: eager's first call "
                     f"computes with {_shown(change.before)}, later ones with {_shown(change.after)}"
             if computed_with else
             f"it changes {_place(change)} ({_shown(change.before)}, then {_shown(change.after)})")
            for change in first.changed(now)]
