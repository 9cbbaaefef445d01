"""Functions a model's modules hold, described so that a swap can be told apart.

A module that keeps a function in an attribute (`self.act = F.gelu`, a `forward`
assigned to an instance, a class whose `forward` was patched) computes what that
function computed when the model was traced: the graph holds its ops. Swapped after
lowering (`model.act = F.silu`), the graph silently ran the old one (a loss 0.135
against eager's 0.156). The frontend records each such function read while tracing by
`describe` (a string, so that the graph's metadata stays JSON and a graph loaded in
another process is checked alike); the runtime describes what the module holds at every
call and compares.

The description names the function (module, qualified name, where its code starts, from
its package's root) and
the plain values its closure captured or a `functools.partial` binds, so that a lambda
re-made with another constant reads as another function. A bound method is its function.
"""

from __future__ import annotations

import ast
import collections
import dis
import functools
import hashlib
import inspect
import operator
import pathlib
import sys
import sysconfig
import textwrap
import types

import torch

from .described_values import described, values_digest

#: The function torch's `autograd.Function.apply` classmethod wraps.
_FUNCTION_APPLY = torch.autograd.Function.__dict__["apply"].__func__

#: The longest text of bound arguments or captured values kept whole in a description.
_SHOWN = 80


def is_function(value) -> bool:
    """A function-like value a module may hold in place of a submodule."""
    return isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                              types.BuiltinMethodType, functools.partial))


def describe(value) -> str:
    """`value` (a function-like object, or an object called like one: a hook) as a string
    that changes when it does."""
    if isinstance(value, functools.partial):
        names = owner_names(value.func)
        keywords = [f"{k}={_bound_text(v, calling(names, k, v))}" for k, v in sorted(value.keywords.items())]
        arguments = [_bound_text(a, calling(names, name, a)) for name, a in zip(bound_names(value), value.args)]
        return f"partial({describe(value.func)}, {_whole(arguments)}, {_whole(keywords)})"
    if isinstance(value, types.MethodType) and value.__func__ is _FUNCTION_APPLY:
        # A custom Function's `apply` held (`self.fn = Scale.apply`): by its class, whose
        # code is compared apart (`frontends/applied_code.py`); torch's `apply` runs
        # other code while a model is traced (`frontends/autograd_functions.py`).
        kind = value.__self__
        return f"{getattr(kind, '__module__', '')}.{getattr(kind, '__qualname__', '?')}.apply"
    if isinstance(value, types.MethodType):
        # Not the class of what it is bound to: FSDP2's `fully_shard` gives each unit a
        # class of its own (FSDPLinear), whose forward is the same function. But what a
        # plain object it is bound to holds (`self.act = annealer.scale`, then
        # `annealer.t = 3.0`): found by a review, the step kept the traced value.
        return describe(value.__func__) + _state(value.__self__, owner_names(value.__func__, value.__self__))
    code = getattr(value, "__code__", None)
    if code is None and called_like_function(value):
        # An object called like a function (a hook `register_forward_hook(annealer)`).
        kind = type(value)
        return (f"{kind.__module__}.{kind.__qualname__} object calling {describe(kind.__call__)}"
                + _state(value, owner_names(kind.__call__)))
    name = f"{getattr(value, '__module__', None) or ''}.{getattr(value, '__qualname__', None) or getattr(value, '__name__', '?')}"
    if code is None:
        return name
    own = describes_captured(value, code)
    names = read_names(value) if own else None
    captured = [text for name, cell in zip(code.co_freevars, value.__closure__ or ()) if filled(cell)
                and (text := _captured_text(cell.cell_contents, own, calling(names, name, cell.cell_contents)))
                is not None]
    # Defaults are values it computes with too (`lambda h, s=2.0: h * s`; found by a review).
    # A plain object's too, by its attributes (`def forward(self, x, cfg=settings)`, then
    # `settings.temp = 0.5`; found by a review).
    defaults = [text for default in described_defaults(value)
                if (text := _value_text(default) or (_bound_text(default) if plain_owner(default) else None))
                is not None]
    read = exec_globals(value)
    read = [f"{name}={text}" for name, item in read[1].items()
            if (text := _value_text(item)) is not None] if read else []
    return (f"{name} at {_place(value, code.co_filename)}:{code.co_firstlineno} #{code_digest(code)}"
            + (f" with {_whole(captured)}" if captured else "")
            + (f" defaults {_whole(defaults)}" if defaults else "")
            + (f" reading {_whole(read)}" if read else ""))


#: How deep `_captured_text` describes functions that functions of the user's code
#: captured; deeper ones are shown by name.
CAPTURED_DEPTH = 3
#: How deep `_held_text` describes (and `function_state._copied` copies) the plain
#: objects and containers such a closure holds, and those they hold: a hook reading
#: `trainer.state.cfg.loss.scale` (found by a review: 3 deep, a change 5 deep trained on
#: with the traced value, 1.73 off eager's gradients). Only attributes the code may
#: read are followed (`read_attributes`), so a deeper walk stays narrow.
HELD_DEPTH = 8
_depth = [0]


def describes_captured(function, code: types.CodeType) -> bool:
    """Whether a description of `function` describes the functions and plain objects its
    closure captured: the user's own code's (not a library's, nor remat-ir's)."""
    return _users_code(code.co_filename) and not (getattr(function, "__module__", None) or "").startswith("remat_ir.")


def captured_functions(function, contents: tuple | None) -> list:
    """The functions among `contents` (what `function`'s closure cells hold) that its
    description describes (`_captured_text`), for `function_state`'s snapshot."""
    code = getattr(function, "__code__", None)
    if not contents or code is None or not describes_captured(function, code):
        return []
    return [item for item in contents if is_function(item) and _value_text(item) is None]


def _captured_text(value, own: bool, names: frozenset[str] | None = None) -> str | None:
    """How a description shows a value a closure captured: `_value_text`, and where the
    function capturing it is the user's own code, a captured function by its own
    description (a few levels deep). Why: `make_act(torch.tanh)` and `make_act(torch.
    sigmoid)`, or two functions one `functools.wraps` decorator wrapped, read as one
    function, so one swapped for the other after `remat` trained on with the old graph,
    0.063 off (found by a review). Not for a library's closures: what transformers'
    decorators and FSDP2's hooks capture is theirs, and describing it made every call
    after `fully_shard` plan again (found by CI)."""
    text = _value_text(value)
    if text is not None or not own:
        return text
    if not is_function(value):
        # A plain object the user's closure captured, by the plain attributes its code
        # reads (`box.k`, a scale a hook reads and the loop sets): unshown, its change
        # trained on with the traced value, 5x eager's loss (found by a review).
        return _held_text(value, names) if names is not None else None
    if _depth[0] >= CAPTURED_DEPTH:
        return f"{getattr(value, '__module__', None) or ''}.{getattr(value, '__qualname__', '?')}"
    _depth[0] += 1
    try:
        return describe(value)
    finally:
        _depth[0] -= 1


def _held_text(value, names: frozenset[str], depth: int = 0, configs: bool = False) -> str | None:
    """A value a closure of the user's code captured, or one such a value holds: as
    `_value_text` shows it, a plain object by the plain attributes code loading `names`
    may read (`read_attributes`), a list, tuple or dict of those by its items, each
    `HELD_DEPTH` deep (`box.inner.k`, `cfgs["a"].k`: unshown, a change trained on with
    the traced value, 0.39 off eager's gradient; found by a review); None for anything
    else. `configs`: of the plain objects, configs only (`config_like`)."""
    text = _value_text(value)
    if text is not None or depth > HELD_DEPTH:
        return text
    if configs and plain_owner(value) and not config_like(type(value)):
        return None
    if is_function(value):
        # A function such an object holds (`self.fn = partial(scaled, t=1.0)`, a
        # schedule's bound method), by its description: replaced, or its bound object
        # changed, it computes otherwise (found by a review: unshown, trained on silently).
        return _captured_text(value, True)
    if nested_owner(value):
        return f"{type(value).__qualname__} " + _whole(_attributes_text(value, names, depth, configs))
    items = objects_held(value)
    if items is None:
        # A longer one (a hook's 300 per-layer configs) by a digest of all it holds: not
        # shown, `cfgs[0].t = 2.0` trained on with the traced value, silently (hunt60).
        digest = values_digest(value) if type(value) in (list, tuple, dict) and len(value) > HELD_ITEMS else None
        return None if digest is None else f"{type(value).__qualname__} {digest}"
    return f"{type(value).__qualname__} " + _whole(
        [f"{key!r}: {_held_text(item, calling(names, None, item), depth + 1, configs) or f'a {type(item).__qualname__}'}"
         for key, item in items])


def _attributes_text(owner, names: frozenset[str], depth: int, configs: bool = False) -> list[str]:
    """'name=text' of the attributes of `owner` (a plain object) that code loading `names`
    may read (`names_reading`: private ones too, a property's `self._scale`, found by a
    review), or of those `any_attributes` gives where that code may read any, each as
    `_held_text` shows it, one level down, by the names reading it loads."""
    read = names_reading(names, owner)
    state = attributes_of(owner) if read is not None else any_attributes(owner, names)
    return [f"{name}={text}" for name, item in sorted(state.items())
            if (read is None or name in read)
            and (text := _held_text(item, calling(read or names, name, item), depth + 1, configs)) is not None] + [
        f"{type(owner).__qualname__}.{name}={_value_text(value)}"
        for name, value in class_values(owner, read).items()]


#: How many objects down from a hook's bound object (or a partial's argument) the plain
#: objects it holds are described and copied where its code may read any attribute
#: (`getattr(obj, key)`, `vars`, `asdict`: `_state`, `function_state._extra`): configs
#: only (`config_like`). Not described at all before, a hook `Holder(cfg).hook` passing
#: `self.cfg` to a helper that used `getattr` anywhere trained on with the traced value
#: after `cfg.t = 3.0`, 0.63 off eager's loss, silently (found by a grid whose configs a
#: global also held, which had hidden it). Not 8 deep, nor through a library's objects:
#: a `Trainer`'s tree cost every call 0.05 s, and its state moves at every step.
ANY_DEPTH = 3


@functools.lru_cache(maxsize=1024)
def users_class(kind: type) -> bool:
    """Whether `kind` is defined in the user's own code (not a library's, nor remat-ir's)."""
    module_name = getattr(kind, "__module__", None)
    if module_name == "__main__":
        return True
    if not isinstance(module_name, str) or module_name.split(".")[0] in ("remat_ir", "builtins"):
        return False
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    return isinstance(file, str) and _users_code(file)


def config_like(kind: type) -> bool:
    """Whether objects of `kind` are configs whose every attribute, private ones its class
    reads and values its class holds included, a forward or hook may compute with, where
    the code may read any attribute (`any_attributes`): a `SimpleNamespace` or an object of
    a class of the user's own. Not a library's objects (a tqdm bar, a logger, a
    `TrainerState`), whose private counters and closures move as the loop runs and would
    plan again at every step."""
    return kind is types.SimpleNamespace or users_class(kind)


#: Of `_ANY_ATTRIBUTE`, the readers of what they are handed whole (`asdict(self.cfg)`):
#: they reach an object's attributes only through those the code names.
_GIVEN_WHOLE = frozenset({"asdict", "astuple", "fields"})


def whole_read(names: frozenset[str], name: str, owner) -> bool:
    """Whether code loading `names`, which may read any attribute of what it holds, may
    reach the attribute `name` of `owner`, the object it is bound to: by a name it does
    not spell (`getattr(self, key)`, `vars(self)`), any; where it only hands objects to
    readers such as `asdict`, those it names, or that the members of `owner`'s class it
    names read (`asdict(self.cfg)`: a sibling's counter planned every call again,
    hunt53; `asdict(self.get_cfg())` over `self._cfg` was then silent, hunt54)."""
    if names & (_ANY_ATTRIBUTE - _GIVEN_WHOLE) or name in names:
        return True
    return any(name in read_names(function) for named in names for function in _members(type(owner), named))


#: The dunder methods whose code reads what an object computes with (others, `__init__`
#: and `__repr__` among them, set or show every attribute).
_READING_DUNDERS = frozenset({"__call__", "__getattr__", "__getitem__"})


def any_attributes(owner, names: frozenset[str] = frozenset()) -> dict:
    """The attributes of a plain object that code reading any of them may compute with:
    its public ones, the private ones among `names` (those the code loads: a helper's
    `c._t`, found by hunt53), and for an object of a class of the user's own the private
    ones its methods, properties and `__getattr__`/`__getitem__`/`__call__` read (`temp`,
    a property or a method returning `self._t`: changed after `remat`, trained on with
    the traced value, 0.05-1.31 off eager's, silently; hunt50 S1, hunt54), and the
    configs its classes hold. (A private counter a method the loop calls moves, `tick()`,
    then plans every call again: loud, where narrower was silent.)"""
    state = attributes_of(owner)
    found = {name: item for name, item in state.items() if not name.startswith("_") or name in names}
    if not users_class(type(owner)):
        return found
    private = _private_read(type(owner))
    found |= {name: item for name, item in state.items() if name.startswith("_") and not name.startswith("__")
              and (private is None or name in private)}
    # And the configs its class holds (`class Cfg: sub = Sub()`), whose values are the
    # config's too (`class_values` gives the plain ones).
    return found | {name: item for name, item in class_held(type(owner), state).items()
                    if plain_owner(item) and config_like(type(item))}


@functools.lru_cache(maxsize=1024)
def _private_read(kind: type) -> frozenset[str] | None:
    """The private names the methods, properties and reading dunders (`_READING_DUNDERS`)
    of `kind`'s classes of the user's own load, their own code and the user's functions
    it calls (`read_names`), not a library's methods (a `Trainer` subclass's: its base's
    bookkeeping planned every call again, hunt53); None for any, where one reads
    attributes by names it does not spell (a `__getattr__` serving from
    `self.__dict__["_d"]`: a global config so passed along trained on with the traced
    value, silently; hunt51 O1)."""
    functions = []
    for klass in kind.__mro__:
        if not users_class(klass):
            continue
        for name, member in vars(klass).items():
            if name.startswith("__") and name not in _READING_DUNDERS:
                continue
            member = member.fget if isinstance(member, property) else member
            member = member.func if isinstance(member, functools.cached_property) else member
            member = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
            functions.append(inspect.unwrap(member) if isinstance(member, types.FunctionType) else member)
    names = frozenset().union(*(read_names(function) for function in functions
                                if isinstance(function, types.FunctionType)))
    if names & _ANY_ATTRIBUTE:
        return None
    return frozenset(name for name in names if name.startswith("_") and not name.startswith("__"))


@functools.lru_cache(maxsize=1024)
def _held_places(kind: type) -> tuple[tuple[type, str], ...]:
    """(class, name) of the values `kind`'s classes of the user's own hold (not methods
    nor other descriptors, nor dunders), where `getattr` finds them first."""
    places = []
    for name in sorted({name for klass in kind.__mro__ for name in vars(klass)}):
        klass = next(klass for klass in kind.__mro__ if name in vars(klass))
        if not name.startswith("__") and users_class(klass) and not hasattr(type(vars(klass)[name]), "__get__"):
            places.append((klass, name))
    return tuple(places)


def class_held(kind: type, exclude=()) -> dict:
    """The values `kind`'s classes of the user's own hold by name (`class Cfg: temp =
    2.0`), but those in `exclude` (an instance's own, which `getattr` finds first)."""
    return {name: vars(klass)[name] for klass, name in _held_places(kind)
            if name not in exclude and name in vars(klass)}


def class_values(owner, read: frozenset[str] | None) -> dict:
    """The plain values of `owner`'s class (and its bases) that code reading `read` (the
    names `names_reading` gives) may read as its own attributes (`self.K`, `cls.K` in a
    class method): found by a review, `type(a).K = 3.0` after `remat` trained on with the
    traced value, silently."""
    if type(owner).__module__ == "builtins":
        return {}
    state = attributes_of(owner)
    if read is None:   # any of them (a config's `class Cfg: temp = 2.0` passed to `getattr`)
        return {name: value for name, value in class_held(type(owner), state).items()
                if _value_text(value) is not None}
    return {name: value for klass, name in _class_places(type(owner), read)
            if name not in state and _value_text(value := vars(klass).get(name)) is not None}


@functools.lru_cache(maxsize=1024)
def _class_places(kind: type, read: frozenset[str]) -> tuple[tuple[type, str], ...]:
    """(class, name) of the names among `read` that `kind`'s classes define, where first
    found, not as functions or descriptors (`class_values` reads their values each time:
    walking every name read at every call cost a hook check 4x; found by a review)."""
    places = []
    for name in sorted(read):
        klass = next((k for k in kind.__mro__ if name in vars(k)), None) if not name.startswith("__") else None
        if klass is not None and klass.__module__ != "builtins" and not hasattr(type(vars(klass)[name]), "__get__"):
            places.append((klass, name))
    return tuple(places)


def owner_names(function, owner=None) -> frozenset[str] | None:
    """The names `function` loads where it is the user's own code (`read_names`): what
    the object it is bound to (a method's `self`, a partial's arguments, an object called
    like a function) holds is described and compared by them, `HELD_DEPTH` deep; None for
    a library's function, whose objects are described by their plain attributes alone.
    Found by a review: `functools.partial(hook, cfg)` reading `cfg.loss.scale` was compared
    by `cfg`'s own attributes, so a change one object down trained on with the traced
    value (2.40 off), and a counter `cfg.step` it never read planned again at every call."""
    code = getattr(function, "__code__", None)
    if code is None or not describes_captured(function, code):
        return None
    names = read_names(function)
    # `owner`: the object a method is bound to, reached by its first parameter (`self()`).
    return calling(names, code.co_varnames[0] if code.co_argcount else None, owner) if owner is not None else names


def nested_owner(value) -> bool:
    """Whether `value`, a plain object a closure captured (or one such a value holds), is
    described (and copied, `function_state._copied`) by its attributes: one not called
    like a function, or one whose class's `__call__` is Python code (found by a review: a
    hook closing over an annealer `ann` read as `ann.t` or `ann()` was not compared, and a
    change trained on with the traced value, 0.65 off)."""
    return plain_owner(value) and (not callable(value) or called_like_function(value))


#: The most items of a container `objects_held` gives (longer ones: `values_digest`).
HELD_ITEMS = 64


def objects_held(value) -> list | None:
    """(key, item) of a list, tuple or dict (of at most 64 items, with plain keys; a config
    container, `_config_container`, too) that holds plain objects (`nested_owner`) or
    functions (`[lambda: cfg.t]`, found by a review), else
    None: described and copied by its items (`{"inner": cfg}`, then `cfg.k = 3.0`), those
    shown by no text (a module, a tensor) by their class. Found by a review: a dict holding
    a module beside the config was not described, and a change trained on silently."""
    if not (type(value) in (list, tuple, dict, collections.OrderedDict) or _config_container(value)) \
            or len(value) > HELD_ITEMS:
        return None
    items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
    if not all(isinstance(key, _PLAIN) for key, _ in items) or not any(
            nested_owner(item) or is_function(item) for _, item in items):
        return None
    return items


@functools.lru_cache(maxsize=1024)
def _users_code(filename: str) -> bool:
    """Whether code from `filename` is the user's own: not the standard library's or an
    installed package's (torch, transformers, peft). (remat-ir's own, installed in place
    from its repository, is told by its module's name.)"""
    paths = sysconfig.get_paths()
    libraries = {paths["stdlib"], paths["platstdlib"], paths["purelib"], paths["platlib"]}
    path = str(pathlib.Path(filename).resolve()) if not filename.startswith("<") else filename
    return not filename.startswith("<frozen") and not any(
        path.startswith(library.rstrip("/") + "/") for library in libraries)


def exec_globals(function) -> tuple[dict, dict] | None:
    """(its globals, {name: value}) of the plain globals a function made from source text
    with a namespace of its own (`exec`, `types.FunctionType` over a dict: code from no
    file, whose globals are no module loaded from one) reads, or None for another
    function. A module's constants are compared as reads of that module; a namespace of
    its own is no module, so one source run with `K = 2.0` and with `K = 3.0` gave two
    functions of one description, and one swapped for the other trained on with the old
    graph, 2.27 off (found by a review)."""
    code = getattr(function, "__code__", None)
    space = getattr(function, "__globals__", None)
    if (code is None or not isinstance(space, dict) or "__file__" in space
            or not code.co_filename.startswith("<") or code.co_filename.startswith("<ipython-input")):
        return None
    return space, {name: space[name] for name in sorted(_names(code))
                   if name in space and _value_text(space[name]) is not None}


def read_names(function) -> frozenset[str]:
    """The names the code of `function` (a function of the user's code), code nested in
    it, the functions its closure captured and the user's global functions it names (3
    deep: a hook calling `read(box)`, where `read = lambda b: b.k`, or a helper
    `read_k(box)`) load: the attributes it may read of what it captured."""
    names, pending, seen = set(), [(function, 0)], set()
    while pending:
        current, depth = pending.pop()
        code = getattr(current, "__code__", None)
        if code is None or code in seen:
            continue
        seen.add(code)
        found = _names(code)
        names |= found
        held = [cell.cell_contents for cell in (current.__closure__ or ()) if filled(cell)]
        space = getattr(current, "__globals__", {})
        reached = _globals_reached(space, found, code)
        if any(isinstance(item, (operator.attrgetter, operator.methodcaller)) for item in held + reached):
            names.add("attrgetter")   # reads an attribute by a name the code does not spell
        if depth < CAPTURED_DEPTH:
            pending += [(item, depth + 1) for item in held if is_function(item)]
            pending += [(item, depth + 1) for item in reached if isinstance(item, types.FunctionType)
                        and _users_code(item.__code__.co_filename)]
    return frozenset(names)


def _globals_reached(space: dict, found: frozenset[str], code: types.CodeType) -> list:
    """The values that code loading the names `found`, with `space` its globals, may call
    among its globals: a global itself, an item of a global dict, list or tuple (`ACTS
    ["scale"](o, box)`, a dict's by the constant keys the code subscripts it by, in a
    table of any size), the attribute `found` names of a global module or class
    (`helpers.scale(o, box)`, a helper in another of the user's files, `pkg.sub.scale`,
    a static method), 3 levels down, and the function a partial wraps or a callable
    object's `__call__`. Found by reviews: a hook handing its object to such a lambda,
    helper, partial or global `attrgetter` was compared by the hook's own names, and a
    change the callee read trained on with the traced value (hunt51, hunt57)."""
    reached: list = []

    def reach(value, depth: int, keys=None) -> None:
        if value is None or depth > 3:
            return
        if isinstance(value, types.ModuleType) or (isinstance(value, type) and users_class(value)):
            members = vars(value)
            for attribute in sorted(name for name in found if name in members):
                member = members[attribute]
                reach(member.__func__ if isinstance(member, (staticmethod, classmethod)) else member, depth + 1)
        elif isinstance(value, dict) and (keys is not None or len(value) <= 1024):
            for key in keys if keys is not None else list(value):
                reach(value.get(key), depth + 1)
        elif isinstance(value, (list, tuple)) and len(value) <= 1024:
            for item in value:
                reach(item, depth + 1)
        elif isinstance(value, functools.partial):
            reached.append(value)
            reach(value.func, depth + 1)
            for item in (*value.args, *value.keywords.values()):
                reach(item, depth + 1)
        else:
            reached.append(value)
            if called_like_function(value):
                reached.append(type(value).__call__)

    for name in sorted(found):
        value = space.get(name)
        reach(value, 0, subscripts(code, name) if isinstance(value, dict) else None)
    return reached


@functools.lru_cache(maxsize=1024)
def subscripts(code: types.CodeType, name: str) -> frozenset | None:
    """The constant keys `code` and the code nested in it subscript global `name` by
    (`ACTS["scale"]`), or None where one of its loads is not so subscripted (`ACTS[key]`,
    passed along): any item. Found by hunt57: every item of a table scanned, a sibling
    lambda reading a trainer's step counter planned every step again."""
    keys = set()
    instructions = list(dis.get_instructions(code))
    for i, instruction in enumerate(instructions):
        if instruction.opname not in _LOADS or instruction.argval != name:
            continue
        after = instructions[i + 1:i + 3]
        if len(after) < 2 or after[0].opname != "LOAD_CONST" or after[1].opname != "BINARY_SUBSCR":
            return None
        keys.add(after[0].argval)
    for nested in code.co_consts:
        if isinstance(nested, types.CodeType):
            inner = subscripts(nested, name)
            if inner is None:
                return None
            keys |= inner
    return frozenset(keys)


#: Names whose load says the code may read any attribute of what it holds, by a name
#: the code does not spell (`getattr(box, "k")`, `vars(box)`, `hasattr`, `attrgetter`).
_ANY_ATTRIBUTE = frozenset({"getattr", "hasattr", "vars", "__dict__", "attrgetter", "methodcaller",
                            "__getattribute__", "dir", "getattr_static", "getmembers", "asdict", "astuple",
                            "fields"})


def read_attributes(names: frozenset[str], owner) -> frozenset[str] | None:
    """The attributes of `owner` (a plain object a closure of the user's code captured)
    that code loading `names` (`read_names`) may read (`names_reading`); None for all of
    them. Not the others: a step counter or a log on the same object, changing at every
    call, made every call lower and plan again (found by a review)."""
    read = names_reading(names, owner)
    if read is None:
        return None
    state = attributes_of(owner)
    return frozenset(name for name in read if name in state)


def names_reading(names: frozenset[str], owner) -> frozenset[str] | None:
    """The names code loading `names` loads when it reads `owner`: `names`, and those that
    the methods and properties of `owner`'s class among them load in turn, and theirs
    (`state.scale()` calling `self._scale()` reading `self.k`), those of its `__call__`
    too where the code may call it (`calling`); None where the code may read an
    attribute by a name it does not spell (`_ANY_ATTRIBUTE`). What `owner` holds is read
    by these names in turn: found by a review, a hook calling `self.scale_of()` that reads
    `self.cfg.scale`, or reading a property so, was compared by the hook's own names one
    object down, and a change trained on with the traced value, 0.65 off; the names alone
    had missed `getattr(box, "k")` and a method's helper, silently (an earlier review)."""
    if names & _ANY_ATTRIBUTE:
        return None
    kind = type(owner)
    cached = _READING.get((names, kind))
    if cached is not None and all(klass.__dict__.get(name) is member for klass, name, member in cached[1]):
        return cached[0]
    read, looked = set(names), []
    pending = list(read)
    found: frozenset[str] | None = None
    while pending:
        name = pending.pop()
        looked += [(klass, name, klass.__dict__[name]) for klass in kind.__mro__ if name in klass.__dict__]
        if _served(kind, name):
            break
        members = _members(kind, name)
        if not any(name in klass.__dict__ for klass in kind.__mro__):
            # Not the class's: the object's own, or what its `__getattr__` serves (from a
            # table it holds, `self._d`: found by hunt51, `_d["k"] = 0.5` after `remat`
            # trained on with the traced value, silently).
            members += _members(kind, "__getattr__")
            looked += [(klass, "__getattr__", klass.__dict__["__getattr__"]) for klass in kind.__mro__
                       if "__getattr__" in klass.__dict__]
        more = frozenset().union(*(read_names(function) for function in members))
        if more & _ANY_ATTRIBUTE:
            break
        pending += sorted(more - read)
        read |= more
    else:
        found = frozenset(read)
    if len(_READING) > 4096:
        _READING.clear()
    _READING[(names, kind)] = (found, tuple(looked))
    return found


#: `names_reading`'s answers by (names, class), with the class members it looked up: an
#: object a hook is bound to whose counter moves is described at every call, and walking
#: its methods again cost a step with 8 hooks on a `transformers.Trainer` 2-4x (a review).
#: Taken again only while those members are the same objects (a method patched on its
#: class since reads otherwise).
_READING: dict = {}


def _served(kind: type, name: str) -> bool:
    """Whether `kind`'s attribute `name` is served by a descriptor of another kind than a
    function, a property or a class or static method (one reading a table the object
    holds: found by a review, its reads were not followed, silently; looked up on the
    class, one raised out of `remat`)."""
    member = next((vars(klass)[name] for klass in kind.__mro__ if name in vars(klass)), None)
    return (member is not None and hasattr(type(member), "__get__")
            and not isinstance(member, (types.FunctionType, property, staticmethod, classmethod,
                                        types.BuiltinFunctionType, types.WrapperDescriptorType,
                                        types.MethodDescriptorType, types.MemberDescriptorType,
                                        types.GetSetDescriptorType, types.ClassMethodDescriptorType)))


def _members(kind: type, name: str) -> list[types.FunctionType]:
    """The Python functions `name` stands for in `kind` and each class of its MRO defining
    it (a method, a property's getter, a class or static method), unwrapped from their
    decorators (`functools.wraps`, `@torch.no_grad()`). Found by a review: a base class's
    method reached by `super().scale_of()`, a decorated one, or a class method's reads
    were not followed, and a change they read trained on with the traced value, silently."""
    found = []
    for klass in kind.__mro__ if kind.__module__ != "builtins" else ():
        member = klass.__dict__.get(name)
        member = member.fget if isinstance(member, property) else member
        member = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
        for _ in range(8):   # a decorator's wrapper, then what it wraps
            if isinstance(member, types.FunctionType):
                found.append(member)
            member = getattr(member, "__wrapped__", None)
    return found


def bound_names(value: functools.partial) -> list[str | None]:
    """The parameter names a partial's positional arguments are bound to (None where not
    told: its function has no Python code, or takes them as `*args`)."""
    code = getattr(value.func, "__code__", None)
    names = list(code.co_varnames[:code.co_argcount]) if code is not None else []
    return [names[i] if i < len(names) else None for i in range(len(value.args))]


def calling(names: frozenset[str] | None, reached_as: str | None, value) -> frozenset[str] | None:
    """`names` (what code reading `value` loads), with `__call__` where `value` is called
    like a function (`called_like_function`) and that code may call it: it uses the name
    `value` is reached by whole (`ann()`, `helper(ann)`: `_names` notes such a use as
    "ann()"), or that name is not known (None: an item of a container). Found by a review: with `__call__` followed for any callable object, a
    trainer whose `__call__` advances a counter the hook never reads planned every step
    again; without it, a closure calling `ann()` had trained on with the traced value."""
    if names is None or not called_like_function(value):
        return names
    if reached_as is None or f"{reached_as}()" in names or "__call__" in names:
        return names | {"__call__"}
    return names


def called_like_function(value) -> bool:
    """Whether `value` is a plain object whose class's `__call__` is Python code (an
    annealer `ann()`, a loss object), not a function, a partial or a bound method."""
    return plain_owner(value) and isinstance(getattr(type(value), "__call__", None), types.FunctionType)


@functools.lru_cache(maxsize=1024)
def _names(code: types.CodeType) -> frozenset[str]:
    """The names `code` and the code nested in it read; `getattr(self, "k", 1.0)` and
    `hasattr(self, "k")` as a read of `k` where every such call spells its name
    (`_spelled_reads`). Why: read as "any attribute", an object whose hook reads one so
    was described whole, and a step counter on it planned every call again (found by a
    review, 0.5 s a step on a tiny network)."""
    names = set(code.co_names) | _called_names(code)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names(constant)
    if names & _BY_NAME and not names & (_ANY_ATTRIBUTE - _BY_NAME) \
            and (spelled := _spelled_reads(code)) is not None:
        names = (names - _BY_NAME) | spelled
    return frozenset(names)


def _called_names(code: types.CodeType) -> set[str]:
    """"X()" for each name X whose object `code` (not the code nested in it) may call: one
    it uses whole, not only to read an attribute of it (`ann()`, `self.act(h)`, passed to
    `helper(ann)`, `map`, `checkpoint`, stored or returned): such an object's `__call__`
    may run (`calling`). A narrower rule, calls alone, missed an object passed to `map`
    or to code in another file, silently (found by a review), where this one plans again
    for a counter its `__call__` advances."""
    found = set()
    instructions = list(dis.get_instructions(code))
    for i, instruction in enumerate(instructions):
        if instruction.opname == "LOAD_METHOD" or (instruction.opname in _LOADS | {"LOAD_ATTR"} and (
                i + 1 == len(instructions) or instructions[i + 1].opname not in ("LOAD_ATTR", "LOAD_METHOD"))):
            found.add(f"{instruction.argval}()")
    return found


_LOADS = frozenset({"LOAD_FAST", "LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_NAME", "LOAD_GLOBAL"})


#: The builtins reading an attribute by a name given as their second argument.
_BY_NAME = frozenset({"getattr", "hasattr"})


def _spelled_reads(code: types.CodeType) -> frozenset[str] | None:
    """The attribute names that the `getattr` and `hasattr` calls of `code` spell as a
    string constant, or None where one does not (`getattr(self, key)`), where `getattr`
    is used otherwise (`f = getattr`), or where its source cannot be read, or no longer
    matches the code (a file edited after it was loaded: each spelled name must be among
    the code's constants, and the calls as many as the code's loads of these names)."""
    try:
        source = textwrap.dedent(inspect.getsource(code))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    spelled, calls = set(), 0
    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in _BY_NAME:
            return None   # `builtins.getattr(self, key)`: not told apart (found by a review)
        if not (isinstance(node, ast.Name) and node.id in _BY_NAME):
            continue
        if id(node) not in called:
            return None
        calls += 1
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _BY_NAME:
            name = node.args[1] if len(node.args) >= 2 else None
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                return None
            spelled.add(name.value)
    if not spelled <= string_constants(code) or calls < _loads_of(code, _BY_NAME):
        return None
    # What `getattr` gives may be used whole (`getattr(self, "scaler")(o)`: its `__call__`
    # was not followed, and a change it read trained on with the traced value; hunt51).
    return frozenset(spelled | {f"{name}()" for name in spelled})


def string_constants(code: types.CodeType) -> set[str]:
    """The strings among the constants of `code` and the code nested in it."""
    found = set()
    for constant in code.co_consts:
        if isinstance(constant, str):
            found.add(constant)
        elif isinstance(constant, types.CodeType):
            found |= string_constants(constant)
    return found


def _loads_of(code: types.CodeType, names: frozenset[str]) -> int:
    """How many times `code` and the code nested in it load a global of `names`."""
    count = sum(1 for instruction in dis.get_instructions(code)
                if instruction.opname in _LOADS | {"LOAD_ATTR", "LOAD_METHOD"} and instruction.argval in names)
    return count + sum(_loads_of(constant, names) for constant in code.co_consts
                       if isinstance(constant, types.CodeType))


def _place(value, filename: str) -> str:
    """The file of a function's code from its package's root (`cm.py`, `transformers/
    models/llama/modeling_llama.py`), as its module's dotted name spells it: the same
    wherever the code is installed. With the whole path, a plan file or saved module
    loaded beside an identical copy of the code in another directory (another machine,
    a container) was refused, naming a function whose digest was the same (found by a
    review); the digest and the name say what it computes."""
    parts = pathlib.PurePath(filename).parts
    module = getattr(value, "__module__", None) or ""
    depth = len(module.split(".")) + (parts[-1:] == ("__init__.py",)) if module != "__main__" else 1
    return "/".join(parts[-depth:]) if parts else filename


def describe_called(value) -> str | None:
    """How a global that a library's code calls is described, or None where it is neither
    a function nor a module called like one: `describe` of a function; for a module, its
    class, its `forward` and the functions that `forward`'s closure holds. Why modules:
    transformers 5.25, with the `kernels` package it now requires, makes a function such as
    `modeling_llama.apply_rotary_pos_emb` an `nn.Module` that calls the function its
    closure holds (`use_kernel_forward_from_hub`); it was not described, and the function
    rebound after lowering (liger-kernel, a custom rotary) trained on with the old one,
    silently (found by CI, 2026-12-03)."""
    if is_function(value):
        return describe(value)
    if isinstance(value, type):   # a class held in a table and called (`ACTS["gelu"]()`)
        # With the user's own `__call__`, which calling an object of it runs without
        # looking it up on the object: `P1.__call__ = f` after `remat` trained on with the
        # traced method, 2.27 off, silently (hunt57).
        call = getattr(value, "__call__", None) if users_class(value) else None
        return f"class {value.__module__}.{value.__qualname__}" + (
            f" calling {describe(call)}" if isinstance(call, types.FunctionType) else "")
    if not isinstance(value, torch.nn.Module):
        return None
    kind = type(value)
    forward = getattr(kind, "forward", None)
    if not isinstance(forward, types.FunctionType):
        return None
    held = [describe(cell.cell_contents) for cell in (forward.__closure__ or ())
            if filled(cell) and is_function(cell.cell_contents)]
    return (f"{kind.__module__}.{kind.__qualname__} module calling {describe(forward)}"
            + (f" with {_whole(held)}" if held else ""))


def described_defaults(function) -> list:
    """The default values of `function`'s parameters that describe it: all but those of
    parameters named with a leading underscore, by convention a cache the function fills
    (`def pattern(n, _memo={})`), which computes no otherwise when it grows (described, it
    planned each step again, found by a review)."""
    code = getattr(function, "__code__", None)
    defaults = function.__defaults__ or ()
    names = code.co_varnames[code.co_argcount - len(defaults):code.co_argcount] if code is not None else ()
    positional = [value for name, value in zip(names, defaults) if not name.startswith("_")] \
        if len(names) == len(defaults) else list(defaults)
    keywords = [value for name, value in (function.__kwdefaults__ or {}).items() if not name.startswith("_")]
    return positional + keywords


def _value_text(value) -> str | None:
    """How a description shows a captured or default value: plain values and containers of
    them by repr, enum members, numpy scalars and dtypes by their description; None for
    anything else (a tensor, a module: compared otherwise, or not at all)."""
    if type(value) is set and plain_container(value):   # in an order no process's hashing decides
        return "{" + ", ".join(sorted(map(repr, value))) + "}"
    if isinstance(value, _PLAIN) or plain_container(value):
        return repr(value)
    return described(value)


def _bound_text(value, names: frozenset[str] | None = None) -> str:
    """How a partial's description shows a value it binds: as `_value_text` does, a plain
    object by its class and plain attributes (`c=annealer`, whose `t` it computes with),
    anything else by its class (never a repr holding an address, which differs per
    process, nor a tensor's values), a function by its description, a few levels deep
    (`partial(apply, torch.tanh)` and `partial(apply, torch.sigmoid)` read as one, 18.0
    off after a swap: found by a review)."""
    text = _value_text(value)
    if text is not None:
        return text
    if is_function(value):
        return _captured_text(value, True)
    return f"{type(value).__qualname__}{_state(value, names)}" if plain_owner(value) else f"a {type(value).__qualname__}"


def _whole(texts: list[str]) -> str:
    """`texts` as a list, whole: past `_SHOWN` characters shortened with a digest of the
    whole, so that a change past what is shown tells."""
    text = "[" + ", ".join(texts) + "]"
    if len(text) > _SHOWN:
        text = f"{text[:_SHOWN - 30]}... (sha1 {hashlib.sha1(text.encode()).hexdigest()[:12]})"
    return text


def plain_owner(value) -> bool:
    """Whether `value` is an object whose attributes a function bound to it may compute
    with and nothing else compares: not a module (its attributes are recorded as read),
    a class or a Python module."""
    return (hasattr(value, "__dict__") or bool(slot_names(type(value)))) and not isinstance(
        value, (torch.nn.Module, torch.Tensor, type, types.ModuleType, types.FunctionType))


def attributes_of(value) -> dict:
    """A plain object's attributes by name: `vars()` of it, with those its classes keep in
    `__slots__` that are set. Why: a `@dataclass(slots=True)` config has no `__dict__`,
    so a hook reading one was not compared, and a change trained on with the traced
    value, 1.73 off eager's gradients (found by a review)."""
    state = getattr(value, "__dict__", None)
    slots = slot_names(type(value))
    if not slots:
        return state if state is not None else {}
    found = dict(state) if state else {}
    for name in slots:
        try:
            found[name] = object.__getattribute__(value, name)
        except AttributeError:   # a slot not set
            pass
    return found


@functools.lru_cache(maxsize=1024)
def slot_names(kind: type) -> tuple[str, ...]:
    """The attribute names `kind` and its bases keep in `__slots__`, in order (none for a
    builtin class)."""
    if kind.__module__ == "builtins":
        return ()
    names: list[str] = []
    for klass in kind.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names += [slots] if isinstance(slots, str) else list(slots)
    return tuple(name for name in dict.fromkeys(names) if name not in ("__dict__", "__weakref__"))


def owner_state(value, names: frozenset[str] | None = None) -> dict | None:
    """The public plain attributes of a `plain_owner` (as `_value_text` shows them), of
    `names` only where given, else None. Not its private ones: a global
    `logging.Logger`'s `_cache` fills as levels are asked, and would make each call a new
    plan."""
    if not plain_owner(value):
        return None
    return {name: text for name, item in attributes_of(value).items()   # not private ones: a logger's
            if not name.startswith("_") and (names is None or name in names)   # cache
            and (text := _value_text(item)) is not None}


def _state(owner, names: frozenset[str] | None = None) -> str:
    """' of Kind [a=1.0, ...]': what a plain object a function is bound to holds, by the
    attributes code loading `names` may read, deep (`owner_names`), else by its plain ones."""
    if names is not None and plain_owner(owner):
        # Where the code may read any attribute by a name it does not spell
        # (`getattr(self, key)`): not 8 deep, a large object graph cost a call 0.05 s
        # (found by a review), but its configs `ANY_DEPTH` deep.
        if read_attributes(names, owner) is not None:
            texts = _attributes_text(owner, names, 0)
        else:
            texts = [f"{name}={text}" for name, item in sorted(any_attributes(owner, names).items())
                     if (text := _held_text(item, calling(names, name, item), HELD_DEPTH - ANY_DEPTH + 1, True)
                         if whole_read(names, name, owner) else _value_text(item)) is not None] + [
                f"{type(owner).__qualname__}.{name}={_value_text(value)}"
                for name, value in class_values(owner, None).items()]
        return f" of {type(owner).__qualname__} {_whole(texts)}" if texts else ""
    state = owner_state(owner)
    if not state:
        return ""
    return f" of {type(owner).__qualname__} {_whole([f'{k}={v}' for k, v in sorted(state.items())])}"


@functools.lru_cache(maxsize=4096)
def code_digest(code: types.CodeType) -> str:
    """A digest of what `code` computes (its instructions, names and constants, nested code
    included), the same in every process: a saved module loaded after its model's file
    was edited in place (a constant 2.0 made 3.0, lines unchanged) ran the old graph,
    silently (found by a review). Sets among the constants are taken sorted (their order
    follows string hashing, which differs per process)."""
    digest = hashlib.sha1()

    def feed(c: types.CodeType) -> None:
        digest.update(c.co_code)
        digest.update(repr((c.co_names, c.co_varnames, c.co_argcount, c.co_kwonlyargcount)).encode())
        for constant in c.co_consts:
            if isinstance(constant, types.CodeType):
                feed(constant)
            else:
                digest.update(_stable(constant).encode())
    feed(code)
    return digest.hexdigest()[:12]


def _stable(constant) -> str:
    if isinstance(constant, frozenset):
        return "frozenset(" + ", ".join(sorted(_stable(item) for item in constant)) + ")"
    if isinstance(constant, tuple):
        return "(" + ", ".join(_stable(item) for item in constant) + ")"
    return repr(constant)


_PLAIN = (bool, int, float, str, type(None))
#: The most items a plain container has to be described: a schedule's list of 100 rates a
#: hook reads by index was not, at 64 (found by a review: a change trained on silently);
#: comparing one of 1024 numbers at every call costs about 10 us.
_PLAIN_ITEMS = 1024


def plain_container(value, depth: int = 0) -> bool:
    """A list, tuple, dict or set of plain values, or of such containers three deep (a
    closure's `cfg = {"scale": 1.0}`, a default `cfg={"loss": {"temp": 1.0}}`): its repr
    names it in every process, and one changed in place computes otherwise."""
    if not (type(value) in (list, tuple, dict, set, collections.OrderedDict) or _config_container(value)) \
            or len(value) > _PLAIN_ITEMS:
        return False
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    return all(isinstance(item, _PLAIN) or (depth < 2 and plain_container(item, depth + 1)) for item in items)


def _config_container(value) -> bool:
    """A named tuple, or a dict whose class serves its keys as attributes (an `AttrDict`,
    `cfg.loss.scale`): configs compared by their items, as a plain tuple or dict is. Found
    by a review: unshown, a change after `remat` trained on with the traced value, 0.024
    off eager's gradients, silently. (Not every subclass: a `defaultdict` memo filling at
    every call would plan every call again.)"""
    kind = type(value)
    if isinstance(value, tuple):
        return isinstance(getattr(kind, "_fields", None), tuple)
    return isinstance(value, dict) and any("__getattr__" in vars(klass) for klass in kind.__mro__[:-2])


def filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:   # an empty cell
        return False
    return True


def attribute_at(owner, dotted: str, missing=None):
    """`owner.a.b` for the dotted name 'a.b' (an object a module holds, or one that object
    holds: `frontends/traced_reads.py` records a config's sub-config so), `missing` where a
    step of it is not there."""
    for name in dotted.split("."):
        owner = getattr(owner, name, missing)
        if owner is missing:
            return missing
    return owner
