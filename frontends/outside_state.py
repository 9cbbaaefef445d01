"""Python state outside the model's modules that a forward may change: the globals of the
user's files, the cells of their functions' closures, the attributes of the plain objects
those globals hold, and the containers the model's modules keep in private attributes or
in the plain objects they hold; and the state of Python's and NumPy's generators, wherever
they are kept.

Tracing runs the forward once, and the graph keeps none of what it did there. A forward
that advanced a counter kept there (`STATE["n"] += 1`, `next(COUNTER)`, a closure's
`n[0] += 1`, `stepper.next_step()` in another of the user's files) computed every step
with the value it had at tracing (0.15-0.47 off eager's, silently); one that appended a
tensor to a list kept there (an MoE's auxiliary losses collected in a global list, a
feature stash on a helper object) left a tracing placeholder in it, on which the user's
loss "trained" without error while the optimizer step changed nothing, or, with the list
cleared after `remat`, dropped the auxiliary term at every step (found by a review,
2026-12-02). `trace_effects.refusing_trace_effects` refuses each such change by name and
puts the slot back as it was.
"""

from __future__ import annotations

import collections
import collections.abc
import copy
import os
import random
import sys
import types
from dataclasses import dataclass
from typing import Callable

import torch

from .held_tensors import held_objects
from .model_lines import in_users_file, is_users_file
from .traced_reads import plain

#: Containers whose items are copied before tracing, to be compared after it.
CONTAINERS = (list, dict, set, collections.deque)
#: A container with more items is not copied (a dataset's list): a forward rarely changes
#: one, and copying it at every lowering would cost its size.
LARGEST = 10_000
#: What a slot that held nothing reads as.
_MISSING = object()


# ---------------------------------------------------------------- generators

def generator_state(value, numpy=None):
    """A copy of a Python or NumPy generator's state, or an `itertools` iterator's
    position; None for anything else."""
    numpy = numpy or sys.modules.get("numpy")
    if isinstance(value, random.Random):
        return value.getstate()
    if numpy is not None and isinstance(value, numpy.random.Generator):
        return copy.deepcopy(value.bit_generator.state)
    if numpy is not None and isinstance(value, numpy.random.RandomState):
        return value.get_state(legacy=False)
    if isinstance(value, types.GeneratorType):   # where it stopped, and its plain locals
        frame = value.gi_frame
        return (_ITERATOR, None if frame is None else
                (frame.f_lasti, [(k, v) for k, v in frame.f_locals.items() if plain(v)]))
    if type(value).__module__ in ("itertools", "builtins") and isinstance(value, collections.abc.Iterator):
        try:   # `next(self.steps)` on an `itertools.count` or `iter(a_list)`: its position, as pickling sees it
            return (_ITERATOR, repr(value.__reduce__()))
        except Exception:
            return None
    return None


#: Marks an iterator's state (which cannot be put back).
_ITERATOR = "iterator"


def iterator_state(state) -> bool:
    return isinstance(state, tuple) and state[:1] == (_ITERATOR,)


def restore_generator(generator, state) -> None:
    if iterator_state(state):
        return
    if isinstance(generator, random.Random):
        generator.setstate(state)
    elif hasattr(generator, "bit_generator"):
        generator.bit_generator.state = state
    else:
        generator.set_state(state)


def same_state(a, b) -> bool:
    """States as `generator_state` gives them (tuples, dicts and numpy arrays nested)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same_state, a, b))
    if hasattr(a, "shape") and hasattr(a, "dtype"):
        return hasattr(b, "shape") and a.shape == b.shape and bool((a == b).all())
    return type(a) is type(b) and a == b


# ---------------------------------------------------------------- slots

@dataclass
class Slot:
    """One place (a global, a closure's cell, an attribute), what it held before tracing,
    and a copy of that container's items or that generator's state."""
    what: str
    read: Callable[[], object]
    write: Callable[[object], None]
    value: object
    items: object = None
    state: object = None

    def changed(self) -> str | None:
        """How the traced forward changed the slot ('from 0 to 1', 'in place'), or None."""
        now = self.read()
        if now is not self.value:
            if plain(self.value) and type(now) is type(self.value) and now == self.value:
                return None
            return f"from {_shown(self.value)} to {_shown(now)}"
        if self.state is not None:
            return None if same_state(generator_state(now), self.state) else "by drawing from it"
        if self.items is None:
            return None
        if isinstance(self.items, dict):
            same = self.items.keys() == now.keys() and all(self.items[k] is now[k] for k in self.items)
        elif isinstance(self.items, set):
            same = self.items == now
        else:
            same = len(self.items) == len(now) and all(a is b for a, b in zip(self.items, now))
        if same:
            return None
        if len(self.items) == len(now):
            return "an item replaced in place"
        return f"in place: {len(self.items)} item{'s' * (len(self.items) != 1)}, then {len(now)}"

    def put_back(self) -> None:
        if self.read() is not self.value:
            self.write(self.value)
        elif self.state is not None:
            restore_generator(self.value, self.state)
        elif self.items is not None:
            self.value.clear()
            (self.value.update if isinstance(self.value, (dict, set)) else self.value.extend)(self.items)


def _shown(value) -> str:
    return "nothing" if value is _MISSING else repr(value) if plain(value) else f"a {type(value).__name__}"


def _watched(what: str, read, write, value, containers_only: bool) -> list[Slot]:
    """[the slot] where `value` is one a forward may change there, else []: a container,
    and unless `containers_only` (where `trace_effects` compares the rest) a plain value
    or a generator."""
    if isinstance(value, CONTAINERS) and len(value) <= LARGEST:
        items = dict(value) if isinstance(value, dict) else set(value) if isinstance(value, set) else list(value)
        return [Slot(what, read, write, value, items=items)]
    if containers_only:
        return []
    if plain(value):
        return [Slot(what, read, write, value)]
    state = generator_state(value)
    return [Slot(what, read, write, value, state=state)] if state is not None else []


def _item(what: str, namespace: dict, key: str, containers_only: bool = False) -> list[Slot]:
    def write(new):
        namespace[key] = new
    return _watched(what, lambda: namespace.get(key, _MISSING), write, namespace[key], containers_only)


def _cell(what: str, cell) -> list[Slot]:
    def read():
        try:
            return cell.cell_contents
        except ValueError:   # a cell not filled (yet, or any more)
            return _MISSING

    def write(new):
        cell.cell_contents = new
    value = read()
    return [] if value is _MISSING else _watched(what, read, write, value, False)


def _closure(where: str, function: types.FunctionType) -> list[Slot]:
    """The slots of the cells of `function`'s closure (a counter's `n = [0]`)."""
    cells = zip(function.__code__.co_freevars, function.__closure__ or ())
    return [slot for name, cell in cells
            for slot in _cell(f"{name!r} of the closure of {function.__qualname__} {where}", cell)]


def _users_object(value) -> bool:
    """A plain object of a class of the user's files (a collector, a step counter's holder),
    not a module, tensor, class, function or a library's object."""
    if isinstance(value, (torch.Tensor, torch.nn.Module, type, types.ModuleType, types.FunctionType,
                          types.MethodType)) or not hasattr(value, "__dict__"):
        return False
    return in_users_file(type(value).__module__)


def slots(model: torch.nn.Module) -> list[Slot]:
    """The slots a traced forward may change outside what `refusing_trace_effects` compares
    on the modules themselves (their attributes, which torch.export puts back as copies
    before this could compare them; plain values on the objects they hold; class
    attributes of the user's classes)."""
    found: list[Slot] = []
    seen: set[int] = set()   # a script is `__main__` and `__mp_main__`
    for name, namespace in list(sys.modules.items()):
        file = getattr(namespace, "__file__", None)
        # (`torch.ops` says its file is "_ops.py", which is no path)
        if not isinstance(file, str) or not os.path.isfile(file) or name.startswith("remat_ir") \
                or id(namespace) in seen or not is_users_file(file):
            continue
        seen.add(id(namespace))
        names = vars(namespace)
        for key, value in list(names.items()):
            if not isinstance(key, str) or key.startswith("__"):
                continue
            found += _item(f"global {key!r} of {name}", names, key)
            if isinstance(value, types.FunctionType) and value.__module__ == name:
                found += _closure(f"of {name}", value)
            elif _users_object(value):
                attributes = vars(value)
                for attribute in list(attributes):
                    found += _item(f"attribute {attribute!r} of global {key!r} of {name}", attributes,
                                   attribute)
    for path, module in model.named_modules():
        if not in_users_file(type(module).__module__):
            continue   # a library's modules keep bookkeeping of their own
        for attribute, value in list(vars(module).items()):
            if isinstance(value, types.FunctionType) and in_users_file(value.__module__):
                found += _closure(f"held by {path or '<root>'} as {attribute!r}", value)
        for attribute, helper in held_objects(module):   # their plain values, generators:
            held = vars(helper)                          # `_put_back_helpers`, `_generators`
            where = f"{path}.{attribute}" if path else attribute
            for name in list(held):
                found += _item(f"attribute {name!r} of the {type(helper).__name__} object at {where}",
                               held, name, containers_only=True)
    return found


def changes(watched: list[Slot], found: list[str]) -> None:
    """Note in `found` each slot the traced forward changed, and put it back."""
    for slot in watched:
        how = slot.changed()
        if how is not None:
            found.append(f"it changes {slot.what} ({how})")
            slot.put_back()
