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
anything: transformers' lazy auto-mappings import every model when theirs run) and
stops at `_BUDGET` values per global: a counter deeper in a big structure is not seen.
Tensors are not compared: one the trace left is a placeholder, which `outside_state`
refuses, and a cache of them is what the graph computes at every step.
"""
from __future__ import annotations

import collections
import dataclasses
import sys
import types

import torch

from .outside_state import generator_state, namespaces, restore_generator, same_state, users_object
from .traced_reads import plain

#: Values of one global looked at, containers' items and objects' attributes together.
_BUDGET = 2000
#: How deep in containers and objects.
_DEPTH = 3
#: Globals compared by identity alone.
_CODE = (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType, torch.nn.Module)


@dataclasses.dataclass
class _Value:
    """What a snapshot saw of one value: `kind` says how `items` holds it."""

    value: object
    kind: str        # plain, state, tensor, other, list, tuple, deque, dict, set, object
    items: object = None


def _seen(value, budget: list[int], depth: int = 0) -> _Value:
    budget[0] -= 1
    if isinstance(value, _CODE):   # most globals: by identity, quickly
        return _Value(value, "other")
    if plain(value):
        return _Value(value, "plain", value)
    if isinstance(value, torch.Tensor):
        return _Value(value, "tensor")
    state = generator_state(value, sys.modules.get("numpy"))
    if state is not None:
        return _Value(value, "state", state)
    if depth >= _DEPTH or budget[0] <= 0:
        return _Value(value, "other")
    for base in (list, tuple, collections.deque):
        if isinstance(value, base):
            return _Value(value, base.__name__, [_seen(item, budget, depth + 1) for item in base.__iter__(value)])
    if isinstance(value, dict):
        return _Value(value, "dict", [(key, _seen(item, budget, depth + 1)) for key, item in dict.items(value)])
    if isinstance(value, (set, frozenset)):
        items = (set if isinstance(value, set) else frozenset).__iter__(value)
        return _Value(value, "set", frozenset(item if plain(item) else id(item) for item in items))
    if _holder(value):
        return _Value(value, "object", [(key, _seen(item, budget, depth + 1)) for key, item in vars(value).items()])
    return _Value(value, "other")


def _holder(value) -> bool:
    """An object whose attributes are the user's values: one of the user's classes, a
    `SimpleNamespace`, a dataclass (a library's other objects keep their own bookkeeping)."""
    return users_object(value) or isinstance(value, types.SimpleNamespace) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type) and hasattr(value, "__dict__"))


def _difference(a: _Value, b: _Value, path: str) -> tuple[str, _Value, _Value] | None:
    """(where in the value, as `path` and the items or attributes read from it; before;
    after) of the first change from `a` to `b`; None if none."""
    if a.kind != b.kind or a.kind == "other" and a.value is not b.value:
        return path, a, b
    if a.kind == "plain":
        return None if type(a.value) is type(b.value) and a.value == b.value else (path, a, b)
    if a.kind == "state":
        return None if same_state(a.items, b.items) else (path, a, b)
    if a.kind in ("tensor", "other"):   # a tensor: a placeholder or a cache (module docstring)
        return None
    if a.kind == "set":
        return None if a.items == b.items else (path, a, b)
    if a.kind in ("dict", "object"):
        keys = [key for key, _ in a.items]
        if keys != [key for key, _ in b.items]:
            return path, a, b
        for (key, x), (_, y) in zip(a.items, b.items):
            inner = f"{path}.{key}" if a.kind == "object" else f"{path}[{key!r}]"
            if (found := _difference(x, y, inner)) is not None:
                return found
        return None
    if len(a.items) != len(b.items):
        return path, a, b
    for i, (x, y) in enumerate(zip(a.items, b.items)):
        if (found := _difference(x, y, f"{path}[{i}]")) is not None:
            return found
    return None


def _shown(seen: _Value) -> str:
    count = len(seen.items) if seen.kind in ("list", "tuple", "deque", "dict", "set") else None
    text = repr(seen.value) if seen.kind == "plain" else (
        f"{count} item{'' if count == 1 else 's'}" if count is not None else f"a {type(seen.value).__name__}")
    return text if len(text) <= 60 else f"{text[:57]}..."


def _put_back(seen: _Value):
    """The value `seen` as it was: containers and objects refilled in place, generators
    set back (an iterator cannot be)."""
    value = seen.value
    if seen.kind == "state":
        restore_generator(value, seen.items)
    elif seen.kind in ("list", "deque"):
        items = [_put_back(item) for item in seen.items]
        type(value).clear(value)
        type(value).extend(value, items)
    elif seen.kind == "dict":
        items = [(key, _put_back(item)) for key, item in seen.items]
        dict.clear(value)
        dict.update(value, items)
    elif seen.kind == "object":
        attributes = vars(value)
        attributes.clear()
        attributes.update((key, _put_back(item)) for key, item in seen.items)
    return value


class Snapshot:
    """The plain values of the user's globals and their functions' closures
    (`outside_state.namespaces`), as `_seen` reads them."""

    def __init__(self):
        self.values: dict[tuple[str, str], tuple[object, _Value]] = {}
        for where, names in namespaces():
            for key, value in list(names.items()):
                if isinstance(key, str) and not key.startswith("__"):
                    self.values[(where, key)] = (names, _seen(value, [_BUDGET]))

    def changed(self, now: Snapshot) -> list[tuple[str, str, _Value, _Value]]:
        """(what, where in it, before, now) of each global changed from this snapshot to `now`."""
        found = []
        for at, (names, before) in self.values.items():
            if at in now.values and (difference := _difference(before, now.values[at][1], at[1])) is not None:
                found.append((at[0].format(repr(at[1])), *difference))
        return found

    def put_back(self, said: list[tuple[str, str]]) -> None:
        """The globals `said` names (`counters`, `settled`) as they were."""
        what = {name for name, _ in said}
        for (where, key), (names, before) in self.values.items():
            if where.format(repr(key)) in what:
                value = _put_back(before)
                if names.get(key) is not value:
                    names[key] = value


def counters(first: Snapshot, traced: Snapshot, again: Snapshot) -> list[tuple[str, str]]:
    """(the global, what the refusal says of it) for each global the first trace (from
    `first` to `traced`) and the second (from `traced` to `again`) both changed: a counter."""
    before = {what: (was, then) for what, _, was, then in first.changed(traced)}
    said = []
    for what, inside, then, now in traced.changed(again):
        if what not in before:
            continue
        place = _place(what, inside)
        if then.kind == "state":
            said.append((what, f"it draws from the {type(then.value).__name__} in {place} at each call"))
        else:
            was, first_then = before[what]
            said.append((what, f"it changes {place} at each call ({_shown(was)}, then "
                               f"{_shown(first_then)}, then {_shown(now)} when traced again)"))
    return said


def _place(what: str, inside: str) -> str:
    """The global, and the item or attribute of it that changed (`STATE['n']`)."""
    return what if "[" not in inside and "." not in inside else f"{what} ({inside})"


def settled(first: Snapshot, traced: Snapshot) -> list[tuple[str, str]]:
    """(the global, what the refusal says of it) for each global the first trace changed,
    where the second trace made another program: eager's first call computed with the
    value before."""
    return [(what, f"it changes {_place(what, inside)} after computing with "
                   f"it: eager's first call computes with {_shown(was)}, later ones with {_shown(then)}")
            for what, inside, was, then in first.changed(traced)]



def changes(first: Snapshot, now: Snapshot) -> list[tuple[str, str]]:
    """(the global, what the refusal says of it) for each global changed from `first` to
    `now`: by a custom autograd Function's backward, which is traced once (`frontends/torch.py`)."""
    return [(what, f"it changes {_place(what, inside)} ({_shown(was)}, then {_shown(then)})")
            for what, inside, was, then in first.changed(now)]
