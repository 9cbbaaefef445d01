"""Python state outside the model's modules that a forward may leave tracing's placeholders
in, and the state of Python's and NumPy's generators, wherever they are kept.

Tracing runs the forward once, and the graph keeps none of what it did there. A forward
that appended a tensor to a list kept outside its modules (an MoE's auxiliary losses
collected in a global list, a feature stash on a helper object) left a tracing
placeholder in it, on which the user's loss "trained" without error while the optimizer
step changed nothing, or, with the list cleared after `remat`, dropped the auxiliary term
at every step (found by a review, 2026-12-02). `placeholders_left` finds such
placeholders in the user's globals, their functions' closures, the objects they hold and
the objects the model's modules hold, names where each was left, and takes them out
again. Other changes there are `outside_values`': a counter is refused, and a first
call's setup (a warn-once set, a lazy probe, a plugin's registry) left as it is; putting
every change back broke the user's own state (review R4).
"""
from __future__ import annotations

import collections
import collections.abc
import functools
import os
import random
import sys
import types
import weakref
import operator

import torch
from torch._subclasses.fake_tensor import FakeTensor

from remat_ir.torchlib.generators import object_state, same_state

from .held_tensors import held_objects
from .model_lines import in_users_file, is_users_file
from .traced_reads import plain

#: What a name that held nothing before tracing reads as.
_MISSING = object()


# ---------------------------------------------------------------- generators

def generator_state(value, numpy=None):
    """A copy of a Python or NumPy generator's state, or an `itertools` iterator's
    position; None for anything else."""
    if not isinstance(value, torch.Generator) and (state := object_state(value, numpy)) is not None:
        return state   # torch's generators are the runtime's to replay
    if isinstance(value, types.GeneratorType):   # where it stopped, and its plain locals
        frame = value.gi_frame
        return (_ITERATOR, None if frame is None else
                (frame.f_lasti, [(k, v) for k, v in frame.f_locals.items() if plain(v)]))
    if type(value).__module__ == "builtins" and isinstance(value, collections.abc.Iterator):
        # `iter(a_list)`: where it is, by what is left (its pickled form holds the whole list)
        return (_ITERATOR, operator.length_hint(value, -1))
    if type(value).__module__ == "itertools" and isinstance(value, collections.abc.Iterator):
        try:   # `next(self.steps)` on an `itertools.count`: its position, as pickling sees it
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


# ---------------------------------------------------------------- placeholders

#: Packages whose modules may load from outside the installed packages and are no user's:
#: Inductor's generated kernels load from its cache folder (their globals change as it
#: compiles: taken for a Function backward's effect, review of the CI run 2026-12-02).
_NOT_USERS = ("remat_ir", "torch", "triton", "torchgen")

#: Module name -> (a weak reference to the module, whether it is one of the user's
#: files): thousands of modules are looked at, five times per lowering, and a module stays
#: what it is; a name bound to another module (a reload, `runpy`'s `__main__`) is judged
#: again, and a module dropped from `sys.modules` is not kept alive by this cache. Judged
#: by their file each time, they took 38 ms of a lowering in the test suite (3,243 modules).
_USERS_MODULES: dict[str, tuple[weakref.ref, bool]] = {}


def _namespaces() -> list[tuple[str, dict]]:
    """(name, globals) of the user's own files, and of `__main__` also without a file (a
    notebook, `python -c`)."""
    found, seen = [], set()
    for name, namespace in list(sys.modules.items()):
        if not isinstance(namespace, types.ModuleType):   # a library's stand-in: no user's
            continue
        known = _USERS_MODULES.get(name)
        if known is None or known[0]() is not namespace:
            known = _USERS_MODULES[name] = (weakref.ref(namespace), _users_module(name, namespace))
        if known[1] and id(namespace) not in seen:
            seen.add(id(namespace))
            found.append((name, vars(namespace)))
    return found


def _users_module(name: str, namespace: types.ModuleType) -> bool:
    if name.split(".")[0] in _NOT_USERS:
        return False
    if name == "__main__":
        return True
    file = getattr(namespace, "__file__", None)
    return isinstance(file, str) and os.path.isfile(file) and is_users_file(file)


def users_object(value) -> bool:
    """A plain object of a class of the user's files (a collector, a settings holder), not
    a module, tensor, class, function or a library's object."""
    if isinstance(value, (torch.Tensor, torch.nn.Module, type, types.ModuleType, types.FunctionType,
                          types.MethodType)) or not hasattr(value, "__dict__"):
        return False
    return in_users_file(type(value).__module__)


def namespaces(model: torch.nn.Module | None = None) -> list[tuple[str, dict]]:
    """(where, as a format for a name in it; a mapping of names to values) of the user's
    globals, their functions' closures, the attributes of their classes and of the user's
    classes of `model`'s modules (defined in a function too: `type(self).calls += 1`)."""
    found, classes = [], {}
    for name, names in _namespaces():
        found.append((f"global {{}} of {name}", names))
        for value in list(names.values()):
            if isinstance(value, types.FunctionType) and value.__module__ == name:
                found.extend(_closure(value, name))
            elif isinstance(value, type) and value.__module__ == name:
                classes[id(value)] = value
    for module in model.modules() if model is not None else ():
        for cls in type(module).__mro__:
            if id(cls) not in classes and in_users_file(cls.__module__):
                classes[id(cls)] = cls
    for cls in classes.values():
        found.append((f"class attribute {{}} of {cls.__qualname__}", ClassAttributes(cls)))
        for value in list(vars(cls).values()):   # a class a function builds: its methods' cells
            if isinstance(value, types.FunctionType):
                found.extend(_closure(value, cls.__module__))
    return found


def _closure(function: types.FunctionType, module: str) -> list[tuple[str, dict]]:
    if not function.__closure__:
        return []
    cells = dict(zip(function.__code__.co_freevars, function.__closure__))
    return [(f"{{}} of the closure of {function.__qualname__} of {module}", _Cells(cells))]


class ClassAttributes(dict):
    """A class's own attributes as a mapping (writes set them on the class)."""

    def __init__(self, cls: type):
        super().__init__()
        self.cls = cls

    def items(self):
        return list(vars(self.cls).items())

    def get(self, key, default=None):
        return vars(self.cls).get(key, default)

    def __setitem__(self, key, value):
        setattr(self.cls, key, value)

    def __delitem__(self, key):
        delattr(self.cls, key)


def holders(model: torch.nn.Module) -> list[tuple[str, dict, dict]]:
    """(where, a namespace, a shallow copy of it) of what a forward may store tensors into
    outside its modules: the globals of the user's files, their functions' closures, the
    attributes of the user's objects they hold, and of the objects the model's modules
    hold. The copy puts back a name the forward assigned a tensor to."""
    found = namespaces(model)
    for name, names in _namespaces():
        for key, value in list(names.items()):
            if isinstance(key, str) and not key.startswith("__") and users_object(value):
                found.append((f"attribute {{}} of global {key!r} of {name}", vars(value)))
    for path, module in model.named_modules():
        for attribute, helper in held_objects(module):
            where = f"{path}.{attribute}" if path else attribute
            found.append((f"attribute {{}} of the {type(helper).__name__} object at {where}", vars(helper)))
    return [(where, names, dict(names.items())) for where, names in found]


class _Cells(dict):
    """A closure's cells as a mapping of name -> contents (reads and writes go to the cells)."""

    def __init__(self, cells: dict):
        super().__init__()
        self.cells = cells

    def items(self):
        return [(name, _contents(cell)) for name, cell in self.cells.items()]

    def get(self, key, default=None):
        return _contents(self.cells[key]) if key in self.cells else default

    def __setitem__(self, key, value):
        self.cells[key].cell_contents = value

    def __delitem__(self, key):
        del self.cells[key].cell_contents


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:   # a cell not filled (yet, or any more)
        return None


def placeholders_left(watched: list[tuple[str, dict, dict]], found: list[str]) -> None:
    """Note in `found` each place of `watched` (`holders`) where the traced forward left a
    tracing placeholder, and take it out: a container's items holding one are removed, a
    name assigned one gets its value from before tracing back."""
    for where, names, before in watched:
        for key, value in list(names.items()):
            if not isinstance(key, str) or key.startswith("__") or not holds_placeholder(value):
                continue
            found.append(f"it stores a tensor in {where.format(repr(key))}, which the graph does "
                         f"not fill at each step, so what reads it there gets a tracing "
                         f"placeholder (return the tensor from the forward, an auxiliary loss as "
                         f"an output; a cache its first call fills: run the model once before "
                         f"remat_ir.remat)")
            if before.get(key, _MISSING) is not value:
                if key in before:
                    names[key] = before[key]
                else:
                    del names[key]
            else:
                _take_out(value)


def holds_placeholder(value, depth: int = 0) -> bool:
    """Whether `value` (a container or plain object, 3 deep) holds a tracing placeholder.
    A container's items are read through the base class's methods: a subclass's own may
    do anything (transformers' lazy auto-mappings import every model class)."""
    if isinstance(value, FakeTensor):
        return True
    if depth >= 3:
        return False
    items = _items(value)
    return any(holds_placeholder(item, depth + 1) for item in items[:_SEARCHED_ITEMS])


#: Items of a container looked at for placeholders (a feature store holds a few).
_SEARCHED_ITEMS = 256


def _items(value) -> list:
    if isinstance(value, (torch.Tensor, torch.nn.Module, type, types.ModuleType, types.FunctionType)):
        return []
    if isinstance(value, dict):
        return list(dict.values(value))
    if isinstance(value, (list, tuple, set, frozenset, collections.deque)):
        return list(_iterate(value))
    if hasattr(value, "__dict__") and not callable(value):
        return list(vars(value).values())
    return []


def _iterate(value):
    for base in (list, tuple, set, frozenset, collections.deque):
        if isinstance(value, base):
            return base.__iter__(value)
    return iter(())


def _take_out(value, depth: int = 0) -> None:
    """Remove the items holding a placeholder from `value`'s containers, 3 deep."""
    if depth >= 3:
        return
    if isinstance(value, dict):
        for key, item in list(dict.items(value)):
            if isinstance(item, FakeTensor):
                dict.__delitem__(value, key)
            else:
                _take_out(item, depth + 1)
    elif isinstance(value, (list, collections.deque, set)):
        kept = [item for item in _iterate(value) if not isinstance(item, FakeTensor)]
        if len(kept) != len(value):
            type(value).clear(value)
            (set.update if isinstance(value, set) else type(value).extend)(value, kept)
        for item in kept:
            _take_out(item, depth + 1)
    elif not isinstance(value, (tuple, frozenset, torch.Tensor)) and hasattr(value, "__dict__") \
            and not callable(value):
        for key, item in list(vars(value).items()):
            if isinstance(item, FakeTensor):
                delattr(value, key)
            else:
                _take_out(item, depth + 1)


def lru_caches(model: torch.nn.Module | None = None) -> list[tuple[object, int]]:
    """(function, entries) of the `functools.lru_cache`d functions of the user's files:
    their globals, closures, and the methods of their classes and of `model`'s (a cached
    method kept the trace's placeholder too, and a plain call after `remat` returned it;
    hunt82 F8)."""
    found = {}
    for _, names in namespaces(model):
        for _, value in list(names.items()):
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, functools._lru_cache_wrapper):
                found.setdefault(id(value), value)
    return [(value, value.cache_info().currsize) for value in found.values()]


def clear_grown(caches: list[tuple[object, int]]) -> None:
    """Empty each cache the traced forward filled: what it cached there were tracing
    placeholders, which a later eager call of the model took (its loss a FakeTensor,
    silently; review R4). The graph computes what the function computes at every step,
    and an eager call fills the cache again."""
    for function, entries in caches:
        if function.cache_info().currsize > entries:
            function.cache_clear()
