"""What a function computes with, beside its code's text: compared by identity at every
call, so that a function found to match its description is not described again (1 us
and more per function and call), and so that one changed in place is seen.

A function object stays the same when a closure cell it reads is rebound (`nonlocal
scale; scale = 3.0`), when a container a cell holds is changed in place (`cfg["scale"] =
2.0`), when its `__code__` is patched, and a `functools.partial` when its keywords are
changed in place: compared by the object alone, each trained on with the traced value,
silently. `snapshot` takes what it holds, `unchanged` compares. Used for the functions a
model holds or calls (`runtimes/traced_reads.py`) and for its hooks (`hooks.py`)."""

from __future__ import annotations

import copy
import functools
import sys
import types

from .callables import (ANY_DEPTH, CAPTURED_DEPTH, HELD_DEPTH, HELD_ITEMS, any_attributes, attributes_of,
                        bound_names, calling, captured_functions, class_held, class_values, config_like,
                        described_defaults, describes_captured, exec_globals, filled as _filled,
                        is_function, names_reading, nested_owner, objects_held, owner_names, plain_container,
                        plain_owner, read_attributes, read_names, whole_read)
from .described_values import values_digest

#: What an emptied cell holds in a snapshot.
_EMPTY = object()


def snapshot(function, depth: int = 0) -> tuple:
    """What a function found to match its description computes with, compared by
    identity at the next call (`unchanged`): its code (`f.__code__ = other.__code__`
    patches the same object), what its closure's cells hold, what a partial binds, its
    defaults and what the object it is bound to holds (`_extra`), and what the functions
    its closure captured and the globals of a function made by `exec` compute with
    (`_inner`), as far as `callables.describe` shows them."""
    cells = _closure(function)
    contents = cells and _contents(cells)
    # A list, dict or set a cell holds, changed in place (`cfg["scale"] = 2.0` on a dict a
    # closure captured), is the same object: its copy tells (`_copied`, `_still`). So do a
    # plain object's attributes, where the description shows them (the user's own code:
    # a library's closures over its config objects are not compared at every call).
    code = _code(function)
    names = (read_names(underlying(function)) if contents and code is not None
             and describes_captured(underlying(function), code) else None)
    copies = contents and tuple(_copied(value, calling(names, name, value))
                                for name, value in zip(code.co_freevars, contents))
    return _code(function), cells, contents, copies if copies and any(c is not None for c in copies) else None, \
        _bound(function), _extra(function), _inner(function, contents, depth)


def unchanged(function, snapshot: tuple) -> bool:
    """Whether `function` computes with what `snapshot` (`snapshot()`) saw."""
    code, cells, contents, copies, bound, extra, inner = snapshot
    if type(function) is types.FunctionType:   # most: a module class's forward (1 us less)
        return function.__code__ is code and (cells is None or _holding(cells, contents)) \
            and (copies is None or _same_copies(contents, copies)) and bound is None \
            and (extra is None or _extra_same(extra)) and (inner is None or _inner_same(inner))
    return (_code(function) is code and (cells is None or _holding(cells, contents))
            and (copies is None or _same_copies(contents, copies))
            and (bound is None or _binding(function, bound))
            and (extra is None or _extra_same(extra)) and (inner is None or _inner_same(inner)))


def _inner(function, contents, depth: int) -> tuple | None:
    """The snapshots of the functions a closure of the user's code captured (a decorator's
    wrapped function, a bound method of an annealer whose `t` changes), and a copy of the
    plain globals a function made by `exec` reads: what `describe` shows of them
    (`callables.captured_functions`, `callables.exec_globals`). Found by a review: a
    closure over `annealer.act` trained on after `annealer.t = 3.0`, 0.246 off, and an
    exec'd function after its `K` changed in place, 0.148 off."""
    captured = captured_functions(function, contents) if depth < CAPTURED_DEPTH else ()
    read = exec_globals(function)
    if not captured and read is None:
        return None
    return (tuple((f, snapshot(f, depth + 1)) for f in captured),
            read and (read[0], tuple(read[1]), tuple(_copied(v) or v for v in read[1].values())))


def _inner_same(inner: tuple) -> bool:
    captured, read = inner
    if not all(unchanged(f, state) for f, state in captured):
        return False
    if read is None:
        return True
    space, names, values = read
    return all(_still(space.get(name, _EMPTY), value) for name, value in zip(names, values))


def _extra(function) -> tuple | None:
    """What else a function computes with: its defaults (the tuple, which setting them
    replaces, and a copy of the keyword defaults, a dict that may be changed in place),
    and the plain objects a method is bound to, that is called like a function, or that a
    partial binds (a copy of their attributes: `annealer.t = 3.0` after `self.act =
    annealer.scale`); None where it has none of them. Found by a review: each trained on with the traced value."""
    owners = ([function.__self__] if type(function) is types.MethodType else
              [*function.args, *function.keywords.values()] if isinstance(function, functools.partial) else
              [] if isinstance(function, (types.FunctionType, types.BuiltinFunctionType)) else [function])
    base = underlying(function)
    defaults, keywords = getattr(base, "__defaults__", None), getattr(base, "__kwdefaults__", None)
    values = tuple(described_defaults(base)) if isinstance(base, types.FunctionType) else ()
    # A default's insides, changed in place (`def forward(self, x, cfg=CFG)`, then
    # `CFG["temp"] = 0.5`; a plain object's attribute): the tuple stays the same object,
    # and the step trained on with the traced value, silently (found by a review).
    # A partial's arguments by the parameter each is bound to (`callables.calling`).
    bound = isinstance(function, functools.partial)
    reached = [*bound_names(function), *function.keywords] if bound else [None] * len(owners)
    pairs = [(owner, name) for owner, name in zip((*owners, *values), (*reached, *([None] * len(values))))
             if plain_owner(owner)]
    owners = tuple(owner for owner, _ in pairs)
    if defaults is None and keywords is None and not owners:
        return None
    # What the owners hold further down, by the names the user's code loads, as
    # `callables.describe` shows it (`owner_names`: `cfg.loss.scale` of a partial's `cfg`).
    names = (owner_names(function.__func__, function.__self__) if type(function) is types.MethodType
             else owner_names(base) if isinstance(function, (functools.partial, types.FunctionType))
             else owner_names(getattr(type(function), "__call__", None)))
    deep = tuple(_copied(owner, reading, owner=True) if read_attributes(reading, owner) is not None
                 else _configs_copied(owner, reading)
                 for owner, reading in ((owner, calling(names, name, owner) if bound else names)
                                        for owner, name in pairs)
                 ) if names is not None else None   # as `callables._state` shows them
    return (base, defaults, keywords, dict(keywords) if keywords else None,
            owners, tuple(_shallow(owner, names is not None and read_attributes(names, owner) is None)
                          for owner in owners), values, _deep_copies(values), deep)


def _configs_copied(owner, names: frozenset[str]) -> _Attributes | None:
    """The configs (`callables.config_like`) an object whose reader may read any
    attribute holds, each copied `callables.ANY_DEPTH` deep, as `callables._state` shows
    them (None where it holds none): a hook `Holder(cfg).hook` passing `self.cfg` to a
    helper using `getattr` trained on with the traced value after `cfg.t = 3.0`, 0.63
    off, silently (found by a grid)."""
    copied = _Attributes({name: (item, _copied(item, calling(names, name, item), HELD_DEPTH - ANY_DEPTH + 1))
                          for name, item in any_attributes(owner, names).items()
                          if (_config(item) or any(_config(held) for _, held in objects_held(item) or ()))
                          and whole_read(names, name, owner)})
    copied.classes = class_values(owner, None)   # its class's own (`class Cfg: t = 1.0`)
    return copied if copied or copied.classes else None


def _config(value) -> bool:
    """A config `_configs_copied` copies: held by the object, or by a list, tuple or dict
    it holds (`self.cfgs["a"]`: found by hunt53, `cfgs["a"].t = 3.0` after `remat`
    trained on with the traced value, 1.31 off, silently, where `self.cfg` was compared)."""
    return plain_owner(value) and config_like(type(value))


def _shallow(owner, containers: bool) -> dict:
    """A plain object's attributes, with the plain containers among them copied where
    `containers` (the user's code may read any of its attributes, which `_copied` does not
    copy deep): one changed in place (`self.values["scale"] = 3.0`, read through a
    descriptor) computes otherwise (found by a review: compared with itself, it trained on
    with the traced value). Not for every object: a `Trainer`'s `log_history`, copied at
    every call, grew the check with the step count."""
    return {name: _plain_copy(value) if containers and plain_container(value) else value
            for name, value in attributes_of(owner).items()}


def _extra_same(extra: tuple) -> bool:
    base, defaults, keywords, keywords_copy, owners, states, values, copies, deep = extra
    return (getattr(base, "__defaults__", None) is defaults and getattr(base, "__kwdefaults__", None) is keywords
            and (keywords_copy is None or _equal(keywords, keywords_copy))
            and all(_equal(attributes_of(owner), state) for owner, state in zip(owners, states))
            and (deep is None or all(c is None or _still(owner, c) for owner, c in zip(owners, deep)))
            and (copies is None or all(copied is None or _same_inside(value, copied)
                                       for value, copied in zip(values, copies))))


def _deep_copies(values: tuple) -> tuple | None:
    """Copies of the containers a description shows whole and the numpy arrays among
    `values` (None for the others: what a description cannot show, copying would not
    tell, and a module or a lock inside one made every call copy it again, or fail),
    or None where there is none."""
    copies = tuple(_plain_copy(value) if plain_container(value) else value.copy() if _is_array(value) else None
                   for value in values)
    return copies if any(c is not None for c in copies) else None


def _is_array(value) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and type(value) is numpy.ndarray


def _same_inside(value, copied) -> bool:
    """Whether a default still equals its deep copy (a numpy array element by element)."""
    if _is_array(value):
        return value.dtype == copied.dtype and value.shape == copied.shape and bool((value == copied).all())
    return _equal(value, copied)


def _same_copies(contents: tuple, copies: tuple) -> bool:
    """Whether the containers among a closure's `contents` still equal their `copies`."""
    return all(copied is None or _still(value, copied) for value, copied in zip(contents, copies))


def underlying(function):
    """The function a bound method or a partial (of either, and so on) calls, else itself."""
    while isinstance(function, (types.MethodType, functools.partial)):
        function = function.__func__ if isinstance(function, types.MethodType) else function.func
    return function


def _code(function):
    """The code object of `function` (of a bound method's or a partial's function), or None."""
    return getattr(underlying(function), "__code__", None)


def _closure(function) -> tuple | None:
    """The cells of `function`'s closure (of a bound method's or a partial's function), or
    None where it has none. A function's closure is fixed; what its cells hold is not."""
    kind = type(function)
    if kind is types.MethodType:
        function, kind = function.__func__, type(function.__func__)
    elif kind is functools.partial:
        function, kind = function.func, type(function.func)
    return function.__closure__ if kind is types.FunctionType else None


def _bound(function) -> tuple | None:
    """What a `functools.partial` binds, its arguments and keyword items, or None for
    another function. The partial object stays the same when its keywords are changed in
    place (`model.act.keywords["negative_slope"] = 0.2`): compared by the object alone,
    the step kept the traced value, silently (2026-11-30)."""
    if not isinstance(function, functools.partial):
        return None
    return (function.args, tuple(function.keywords.items()),
            [_copied(value) for value in (*function.args, *function.keywords.values())])


class _Attributes(dict):
    """A copy of a plain object's attributes (`_copied`), compared with `attributes_of` it;
    `every` where all its public ones were copied, whose names are compared too (one
    added later, `box.k` read under `hasattr(box, "k")`, was not seen: a review); else
    `read`, the names its reader may read (`callables.names_reading`), one of which set
    later computes otherwise too."""

    every = False
    read: frozenset | None = None
    #: The class's plain values it reads (`callables.class_values`).
    classes: dict = {}


class _Items(dict):
    """A copy of a list's, tuple's or dict's items holding plain objects (`_copied`):
    key -> (the item, its own copy or None); `kind`, the container's type."""

    kind: type = list


def _copied(value, names: frozenset[str] | None = None, depth: int = 0, owner: bool = False):
    """A copy of what a captured or bound value holds that may change in place, as
    `describe`'s text shows it: a plain container whole (`cfg["aux"]["k"] = 2.0`, a list
    inside a tuple), a numpy array, a plain object's attributes (`box.k = 2.0`), another
    list, dict or set shallowly (`keywords["pad"][0] = 2`); else None. A plain object's
    attributes where `names` (those the user's function that captured it loads,
    `callables.read_names`) are given: those it reads (`callables.read_attributes`), each
    copied so in turn (`box.cfg["k"] = 2.0`). Found by a review: a hook reading a number
    nested so trained on with the traced one, 5x eager's loss."""
    if plain_container(value):
        return _plain_copy(value)
    if names is not None and depth <= HELD_DEPTH and (items := objects_held(value)) is not None:
        # A container holding plain objects, by its items (`callables._held_text`).
        copied = _Items({key: (item, _copied(item, calling(names, None, item), depth + 1)) for key, item in items})
        copied.kind = type(value)
        return copied
    if names is not None and type(value) in (list, tuple, dict) and len(value) > HELD_ITEMS \
            and (digest := values_digest(value)) is not None:
        # Longer (a hook's 300 per-layer configs), by a digest of all it holds, as
        # `callables._held_text` describes it (hunt60: `cfgs[0].t = 2.0`, unseen, silent).
        return _Digest(digest)
    if type(value) in (list, dict, set):
        return copy.copy(value)
    if _is_array(value):
        return value.copy()
    if names is not None and is_function(value) and 0 < depth <= HELD_DEPTH and _nesting[0] < CAPTURED_DEPTH:
        # A function a plain object or a container holds (`self.fn = partial(scaled,
        # t=1.0)`), by its own snapshot: its keywords changed in place, or what its closure
        # holds, compute otherwise (`callables._held_text` describes it; found by a review).
        # (A closure's own functions are `_inner`'s.) Nested a few deep at most: a lambda
        # an object holds may hold that object.
        _nesting[0] += 1
        try:
            return _Function(snapshot(value, CAPTURED_DEPTH))
        finally:
            _nesting[0] -= 1
    if names is not None and (nested_owner(value) or (owner and plain_owner(value))) and depth <= HELD_DEPTH:
        # The plain objects it holds by their attributes in turn (`box.inner.k`), as
        # `callables._held_text` describes them.
        read = names_reading(names, value)
        state = attributes_of(value) if read is not None else any_attributes(value, names)
        copied = _Attributes({name: (item, _copied(item, calling(read or names, name, item), depth + 1))
                              for name, item in state.items() if read is None or name in read})
        copied.every, copied.read, copied.classes = read is None, read, class_values(value, read)
        return copied
    return None


#: How many `snapshot`s of held functions `_copied` is inside.
_nesting = [0]


class _Function(tuple):
    """A function's `snapshot`, taken as a copy of it (`_copied`)."""


class _Digest(str):
    """A long container's `values_digest`, taken as a copy of it (`_copied`)."""


def _plain_copy(value):
    """A copy of a plain container (`callables.plain_container`) as builtin lists, tuples,
    dicts and sets, equal to it while it holds what it held: a config container's class
    may not copy (an `AttrDict` serving `__deepcopy__` from its items raised KeyError)."""
    if isinstance(value, dict):
        return {key: _plain_copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set)):
        return type(value)(map(_plain_copy, value)) if type(value) in (list, tuple, set) \
            else tuple(map(_plain_copy, value))
    return value


def _still(value, copied) -> bool:
    """Whether `value` still holds what its copy (`_copied`) does."""
    if isinstance(copied, _Function):
        return unchanged(value, tuple(copied))
    if isinstance(copied, _Digest):
        return type(value) in (list, tuple, dict) and values_digest(value) == copied
    if isinstance(copied, _Items):
        items = objects_held(value) if type(value) is copied.kind else None
        return items is not None and len(items) == len(copied) and all(
            key in copied and item is copied[key][0] and (copied[key][1] is None or _still(item, copied[key][1]))
            for key, item in items)
    if isinstance(copied, _Attributes):
        state = attributes_of(value) if plain_owner(value) else None
        if state is None or (copied.every and {n for n in state if not n.startswith("_")}
                             != {n for n in copied if not n.startswith("_")}):
            return False
        if copied.read is not None and not copied.read.isdisjoint(state.keys() - copied.keys()):
            return False   # one it reads set since (`getattr(cfg, "k", 1.0)` read it as absent)
        if copied.classes and class_values(value, copied.read) != copied.classes:
            return False   # its class's (`type(a).K = 3.0`)
        return all((state[name] if name in state else class_held(type(value)).get(name, _EMPTY)) is then
                   and (inner is None or _still(then, inner)) for name, (then, inner) in copied.items())
    return _same_inside(value, copied)


def _binding(function, bound: tuple) -> bool:
    """Whether the partial `function` binds the objects `bound` (`_bound`) held."""
    args, keywords, copies = bound
    if len(function.args) != len(args) or len(function.keywords) != len(keywords):
        return False
    for now, then in zip(function.args, args):
        if now is not then:
            return False
    for (name, value), (then_name, then) in zip(function.keywords.items(), keywords):
        if name != then_name or value is not then:
            return False
    values = (*args, *(value for _, value in keywords))
    return all(copied is None or _still(value, copied) for value, copied in zip(values, copies))


def _equal(value, copied) -> bool:
    try:
        return bool(value == copied)
    except (RuntimeError, ValueError, TypeError):   # tensors inside: described again instead
        return False


def _contents(cells: tuple) -> tuple:
    return tuple(cell.cell_contents if _filled(cell) else _EMPTY for cell in cells)


def _holding(cells: tuple, contents: tuple) -> bool:
    """Whether each of `cells` holds the object it held when `contents` was read. A plain
    loop: transformers' decorated forwards are closures, so this runs for most functions
    of such a model at every call (a generator and a tuple per function cost 10-20 us per
    call on the quick GPT-2)."""
    try:
        for cell, then in zip(cells, contents):
            if cell.cell_contents is not then:
                return False
    except ValueError:   # a cell emptied since
        return False
    return True
