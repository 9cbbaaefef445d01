"""The plain Python values a forward read while tracing: the graph holds what they chose.

A flag decides a branch, a temperature becomes a constant of the graph: tracing runs the
forward once, so a value changed later (a temperature schedule, `model.config.x = ...`,
`set_attn_implementation`) would silently train with the value traced. The frontend
records each one with its value in the graph's metadata, and the runtime compares them at
every call (`runtimes/traced_reads.py`): a call after one changed is lowered and planned
again (`remat`), or refused (a graph run without a planner). Besides plain values (bool,
int, float, str, None), enum members, numpy scalars and dtypes read as such are recorded
by a description (`recorded`, `torchlib/described_values.py`): `if self.mode is
Mode.SUM` and `x.to(self.compute_dtype)` are baked in as surely.

Recorded, as the forward runs under tracing (but for what the forward itself assigned
before reading it, which depends on no state a call brings):
- attributes of the model's modules (`self.use_extra`, a dropout's `p`, a class attribute
  read through `self`), and the items of their public lists, tuples and dicts (a conv's
  `stride`, `self.opts["temp"]`);
- attributes of plain objects the modules hold (a config: `self.config.output_hidden_states`,
  a dataclass, a `SimpleNamespace`, a loss object called like a function), and of the
  plain objects those hold (`self.cfg.inner.temp`, held as `cfg.inner`). Where the
  object's class can be instrumented, the attributes read; where not (builtin types such
  as `SimpleNamespace`), all its plain ones;
- the items of the lists, tuples and dicts those objects hold (`self.cfg.sched["temp"]`,
  held as the container `cfg.sched`);
- environment variables the model's code reads (`os.environ.get`, `os.getenv`, `in`), as
  items of the global `os.environ` (`_recording_environment`);
- attributes the model's code looked up on a module or such an object and did not find
  (`hasattr(self, "_loss_function")`, `getattr(self.cfg, "temp", 1.0)`), as `ABSENT`:
  one set later changes what the forward does;
- functions the modules hold (`self.act = F.gelu`) and the `forward` each module ran,
  described by `torchlib.callables` (a swap or a patched forward computes otherwise).

Found in the code (the methods of the model's module classes in the user's own files,
of the custom autograd Functions it applies, whose backward is traced into the graph,
and the user's functions they call by name): globals of plain values, the plain items of
global dicts, lists and tuples, plain attributes of global classes, modules and plain
objects read as `Global.name` (or deeper: `Global.inner.name`), and the global functions
called, by their description (in a library's module classes, transformers' included,
only those: a function patched later, as liger-kernel rebinds
`modeling_llama.apply_rotary_pos_emb`, computes otherwise); where those are tensors, where they are (`tensors`), for
`frontends/held_tensors.py`, which checks the ones traced as constants by their bytes.
Also found in the code: the plain items of a dict a global module or class holds
(`settings.D["temp"]`), and the plain class attributes the user's module classes name,
recorded as attributes of the module's `__class__` (`type(self).T` is no lookup on the
module).
"""

from __future__ import annotations

import ast
import contextlib
import dis
import functools
import inspect
import itertools
import os
import sys
import textwrap
import threading
import types
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from remat_ir.torchlib.callables import (HELD_ITEMS, any_attributes, attribute_at, attributes_of, class_held,
                                         config_like, describe, describe_called, filled, is_function,
                                         slot_names, string_constants, users_class)
from remat_ir.torchlib.described_values import (ATTRIBUTES, DESCRIBED, DIGEST, FUNCTION, LENGTH as LENGTH_KEY,
                                               NESTED, ORDER as ORDER_KEY, PUBLIC_NAMES, described,
                                               values_digest)
from remat_ir.torchlib.hooks import hook_functions
from remat_ir.torchlib.namespaces import remember

from .fx_nodes import custom_op_definitions
from .model_lines import in_users_file, is_model_file, is_users_file
from .stored_tensors import METADATA as STORED, StoredTensors

#: Value types whose value tracing bakes into the graph (a branch on a flag).
PLAIN_TYPES = (bool, int, float, str, type(None))
#: A recorded value that may be either of a list's (`_as_left`): {ANY_OF: [first, second]}.
ANY_OF = "any of"
#: The value recorded for an attribute the forward looked up and found missing; the
#: runtime's `getattr(module, name, "<missing>")` gives it while it stays missing.
ABSENT = "<missing>"
#: Containers with more items than this are not recorded (their checks would cost more
#: than a step's worth of bookkeeping); neither is code deeper than `_DEPTH` calls, nor
#: containers held deeper than `_NESTING` in others. 256: a config's per-layer list
#: (`layer_types` of an 80-layer model) is recorded; with 64 it was not, and a change of
#: it after `remat` trained on with the traced items, silently.
_MAX_ITEMS, _DEPTH, _NESTING = 256, 4, 3
#: The key under which `plain_items` records a container's length.
LENGTH = {LENGTH_KEY: None}
#: The key under which `plain_items` records a dict's keys in their order.
ORDER = {ORDER_KEY: None}
#: The key under which `plain_items` records a long container's digest (`values_digest`).
DIGESTED = {DIGEST: None}


def plain(value) -> bool:
    """A value of `PLAIN_TYPES` that equals itself (NaN never does)."""
    return type(value) in PLAIN_TYPES and value == value   # NaN never compares equal


#: What `recorded` gives for a value that is not recorded.
UNRECORDED = object()


def recorded(value):
    """The form a scalar the forward read is recorded in: a plain value as it is; an enum
    member, a numpy scalar or a dtype as {DESCRIBED: its text} (`torchlib.described_values`:
    tracing bakes them in as surely); `UNRECORDED` for anything else."""
    if plain(value):
        return value
    text = described(value)
    return {DESCRIBED: text} if text is not None else UNRECORDED


def held_form(value):
    """`recorded(value)`, or for a module an object holds or a table holds as an item
    ({FUNCTION: its description}, which the runtime pins to the module object itself:
    `runtimes/traced_reads.py`): one switched to a sibling after `remat` trained on with
    the traced weights, silently (found by reviews: through a dict's item, 3.1 off; through
    a config object's attribute, 11.6 off)."""
    form = recorded(value)
    if form is UNRECORDED and isinstance(value, torch.nn.Module) and (text := describe_called(value)) is not None:
        return {FUNCTION: text}
    return form


def plain_items(container, depth: int = 0) -> list | None:
    """[[key, value], both as `recorded`] of a list's, tuple's or dict's items whose key
    and value are recorded (None: not one, or too big), and its length (`LENGTH`). A key
    recorded by its description (`{Mode.SUM: 1.0}`, `{torch.float32: 2.0}`: found by a
    review, changed after lowering 0.67 off eager, silently) is found again by it
    (`runtimes/traced_reads.py` `_item`). An item that is itself such a container is
    recorded as {NESTED: its items}, `_NESTING` deep (`self.cfg["attn"]["t"]`). Why the
    length: a forward that iterates (`for s in self.scales`, `self.cfg.items()`) reads
    every item, and one appended after lowering was silently skipped (150.4 where eager
    gives 12.3). A dict's keys in their order too (`ORDER`), where they are strings or
    integers: a forward iterating it follows that order."""
    if not isinstance(container, (list, tuple, dict)):
        return None
    if len(container) > _MAX_ITEMS:   # a long schedule or table: by a digest of all it holds
        digest = values_digest(container)
        return None if digest is None else [[DIGESTED, digest], [LENGTH, len(container)]]
    pairs = container.items() if isinstance(container, dict) else enumerate(container)
    items = []
    for key, value in pairs:
        if (key_form := recorded(key)) is UNRECORDED:
            continue
        form = recorded(value)
        if form is UNRECORDED and (text := describe_called(value)) is not None:
            # A function or a module an item holds (`self.acts["x"](h)`, `ACTS[name]`), by
            # its description: swapped after lowering, the graph ran the old one, silently
            # (found by a review).
            form = {FUNCTION: text}
        if form is UNRECORDED and depth < _NESTING and (inner := plain_items(value, depth + 1)) is not None:
            form = {NESTED: inner}
        if form is UNRECORDED and _plain_object(value):
            # A plain object an item holds (`self.d["k"].v`): changed after lowering, the
            # step kept the traced value, 44 off eager's gradient, silently (a review).
            form = object_form(value, depth)
        if form is not UNRECORDED:
            items.append([key_form, form])
    if not items:
        return None
    order = [[ORDER, list(container)]] if isinstance(container, dict) and len(container) > 1 and all(
        type(key) in (str, int) for key in container) else []
    return items + [[LENGTH, len(container)]] + order


def object_form(value, depth: int = 0) -> dict:
    """A plain object as recorded where its reads are not seen one by one (held by a
    container, or by a global the code passes along: `scale_of(CFG.sub)`, `getattr(CFG,
    "t", 1.0)`, both trained on with the traced value after a change, 0.65 off eager's
    gradients, silently; found by a review): {ATTRIBUTES: its class (an instance of
    another, called like a function, swapped in: 127 off), its public attribute names
    (`PUBLIC_NAMES`: one set later), and those attributes whose values are recorded,
    plain objects and containers among them `_NESTING` deep}."""
    state = attributes_of(value)
    functions = config_like(type(value))
    named = any_attributes(value) | class_held(type(value), state)
    attributes = [[name, held] for name, item in sorted(named.items())
                  if (held := _form_within(item, depth, functions)) is not UNRECORDED]
    public = sorted(name for name in state if not name.startswith("_"))
    return {ATTRIBUTES: [["__class__", {FUNCTION: describe_called(type(value))}], [PUBLIC_NAMES, public],
                         *attributes]}


def _form_within(item, depth: int, functions: bool):
    """How `object_form` records an attribute: `held_form`, a function a config holds by
    its description where `functions` (`cfg.act(h)`, a partial's keyword: swapped after
    `remat`, the step ran the traced one, 0.012 off; hunt50 S3), a container or a plain
    object `_NESTING` deep; else `UNRECORDED`."""
    held = held_form(item)
    if held is UNRECORDED and functions and (text := describe_called(item)) is not None:
        held = {FUNCTION: text}
    if held is UNRECORDED and depth < _NESTING:
        if (inner := plain_items(item, depth + 1)) is not None:
            held = {NESTED: inner}
        elif _plain_object(item):
            held = object_form(item, depth + 1)
    return held


class ModulesByDict:
    """A model's modules and their paths (the first of a module at several), found from a
    module or from a torch.export proxy of one. A model holding one module at two paths is
    traced on `_ModuleStackTracer`'s proxies, other objects that share the module's
    `__dict__`: looked up by object, none of such a model's reads was recorded (found by a
    review: a flag turned off after `remat` trained on, 4.62 where eager gives 2.31) nor
    its assignments noted (`trace_effects`). So they are looked up by their dictionary."""

    def __init__(self, model: torch.nn.Module):
        self._found: dict[int, tuple[str, torch.nn.Module]] = {}
        for path, module in model.named_modules(remove_duplicate=False):
            self._found.setdefault(id(module.__dict__), (path, module))

    def of(self, module) -> tuple[str, torch.nn.Module] | tuple[None, None]:
        """(path, the module itself) of `module` or of the module it stands for."""
        return self._found.get(id(object.__getattribute__(module, "__dict__")), (None, None))


def _plain_object(value) -> bool:
    """An object whose attributes configure a forward (a config, a dataclass, a loss
    object called like a function: `self.loss = FocalLoss(gamma=2)`), those of a class
    with `__slots__` too (`@dataclass(slots=True)`: found by a review, a change after
    `remat` trained on with the traced value, silently)."""
    return ((hasattr(value, "__dict__") or slot_names(type(value))) and not is_function(value)
            and not isinstance(value, (torch.nn.Module, torch.Tensor, type, types.ModuleType)))


@dataclass
class TracedReads:
    """What a forward read, keyed by where it lives; values as at the first read (or
    either of two, `_as_left`)."""
    #: (module path, attribute) -> value
    modules: dict = field(default_factory=dict)
    #: (module path, attribute) -> [[key, value]] of a container attribute, or of one an
    #: object the module holds holds, by its dotted name (`cfg.sched`: `self.cfg.sched["temp"]`)
    containers: dict = field(default_factory=dict)
    #: (module path, attribute holding the object, its attribute) -> value
    objects: dict = field(default_factory=dict)
    #: (Python module, global name, None | ["item", key] | ["attr", name] | ["attr", name,
    #: key] | ["function"]) -> value (a function's `describe`); environment variables are
    #: items of `os.environ`
    globals: dict = field(default_factory=dict)
    #: Decisions made from the values of inputs (`torchlib.value_guards`), in trace order.
    decisions: list = field(default_factory=list)
    #: (module path, attribute) -> `torchlib.callables.describe` of a function a module
    #: holds (`self.act = F.gelu`) or its `forward`
    callables: dict = field(default_factory=dict)
    #: id(tensor) -> (Python module, global name, None | ["attr", name]) of the tensors the
    #: code reads from globals (`frontends/held_tensors.py` keeps the ones traced as constants)
    tensors: dict = field(default_factory=dict)
    #: The user-defined `autograd.Function` classes the forward applied
    #: (`autograd_functions.preserving_functions`): their code is the model's (`record_globals`).
    functions: set = field(default_factory=set)
    #: Per trace, the numbers one forward draws from Python's generator, each known by its
    #: range alone (`python_draws`): what the runtime draws at every training call.
    python_draws: list = field(default_factory=list)
    #: Tensors the forward stores on its modules (`stored_tensors`), returned after its outputs.
    stored: StoredTensors = field(default_factory=StoredTensors)
    #: The user's classes of the objects the forward read from its modules (`hold`): the
    #: class values their code names are recorded (`record_globals`, `type(self.box).temp`).
    classes: set = field(default_factory=set)
    #: [module path, attribute, value] the forward assigns at a first call's setup, which
    #: the runtime assigns after each call of this graph (`frontends/torch.py` `_export`).
    assigned_after: list = field(default_factory=list)
    #: (module path, attribute) -> the plain value the forward assigned there, which the
    #: attribute held already (`trace_effects`): what every call assigns, once the trace
    #: left it on the model (`frontends/torch.py` `_export`).
    settled: dict = field(default_factory=dict)
    #: (module path, attribute) of every attribute of its own the forward read from a
    #: module: the functions a module holds are the model's code only where read
    #: (`_held_functions`).
    attributes_read: set = field(default_factory=set)

    def clear(self) -> None:
        """Forget what was read (the frontend traces again)."""
        for table in (self.modules, self.containers, self.objects, self.globals, self.decisions,
                      self.callables, self.tensors, self.functions, self.python_draws, self.classes,
                      self.attributes_read):
            table.clear()
        self.stored.places.clear()
        self.assigned_after = []
        self.settled = {}

    def take(self, other: TracedReads) -> None:
        """Hold what `other` (a `copy` of another trace's) read, in place of what this one did."""
        self.clear()
        for name, value in vars(other.copy()).items():
            setattr(self, name, value)
        self.assigned_after = list(other.assigned_after)

    def copy(self) -> TracedReads:
        return TracedReads(dict(self.modules), dict(self.containers), dict(self.objects),
                           dict(self.globals), list(self.decisions), dict(self.callables),
                           dict(self.tensors), set(self.functions), list(self.python_draws),
                           self.stored.copy(), set(self.classes), attributes_read=set(self.attributes_read))

    def either(self, other: TracedReads) -> None:
        """Where `other`, read by another trace that made the same program, read another
        plain value, record either (`ANY_OF`)."""
        for mine, theirs in ((self.modules, other.modules), (self.objects, other.objects)):
            for key, value in theirs.items():
                if key in mine and plain(value) and plain(mine[key]) and not (
                        value == mine[key] and type(value) is type(mine[key])):
                    mine[key] = {ANY_OF: [value, mine[key]]}

    def metadata(self) -> dict[str, list]:
        """JSON-ready lists for the graph's metadata, sorted."""
        def rows(table):
            return sorted(([*key, value] for key, value in table.items()), key=repr)
        return {"torch.module_attributes": rows(self.modules),
                "torch.module_containers": rows(self.containers),
                "torch.object_attributes": rows(self.objects),
                "torch.module_callables": rows(self.callables),
                "torch.global_reads": [[module, name, list(where) if where else None, value]
                                       for (module, name, where), value in
                                       sorted(self.globals.items(), key=repr)],
                **({"torch.python_draws": self.python_draws[-1]} if self.python_draws else {}),
                **({"torch.assigned_after": self.assigned_after} if self.assigned_after else {}),
                **({STORED: [list(place) for place in self.stored.places]} if self.stored.places else {})}


def _instrument(cls: type, holders: dict, reads: TracedReads, hold) -> None:
    """Make `cls` record the plain attributes read from the objects in `holders`, and
    `hold` the plain objects read from them (a config's sub-config: `self.cfg.inner.temp`,
    held as `cfg.inner`); raises TypeError for a class that cannot be changed (builtin
    types)."""
    lookup = cls.__getattribute__
    fallback = getattr(cls, "__getattr__", None)

    def note(self, name, value) -> None:
        holder = holders.get(id(self))
        if holder is not None and name == "__dict__" and isinstance(value, dict):
            # `vars(self.cfg)["t"]`: each of its attributes, read by no lookup of its own
            # (found by a grid: changed after `remat`, it trained on with the traced value,
            # 0.63 off eager's loss, silently).
            for key, item in list(value.items()):
                if isinstance(key, str):
                    note(self, key, item)
        elif holder is not None and not name.startswith("__"):
            reads.classes.update(classes_within(value))   # `self.box.c.temp`, `c` a class
            if (form := held_form(value)) is not UNRECORDED:
                reads.objects.setdefault((*holder, name), form)
            elif (not name.startswith("_") or in_users_file(type(self).__module__)) \
                    and holder[1].count(".") < _DEPTH:   # the user's objects' private ones too
                if _plain_object(value):
                    hold(holder[0], f"{holder[1]}.{name}", value)
                elif (items := plain_items(value)) is not None:   # `self.cfg.sched["temp"]`
                    reads.containers.setdefault((holder[0], f"{holder[1]}.{name}"), items)
            elif holder[1].count(".") < _DEPTH and _own_method_reading(self) \
                    and (items := plain_items(value)) is not None:
                # A library object's private table its own method hands the forward
                # (`self.sched.get_last_lr()[0]`, a scheduler's `_last_lr`): found by hunt51,
                # the scheduler stepped after `remat` trained on with the traced rate, silently.
                reads.containers.setdefault((holder[0], f"{holder[1]}.{name}"), items)

    def getattribute(self, name):
        try:
            value = lookup(self, name)
        except AttributeError:   # `getattr(self.config, "temp", 1.0)`: one set later counts
            holder = holders.get(id(self))
            if (holder is not None and not name.startswith("__")
                    and getattr(type(self), "__getattr__", None) is None
                    and is_model_file(sys._getframe(1).f_code.co_filename)):
                reads.objects.setdefault((*holder, name), ABSENT)
            raise
        if name == "__getstate__":
            if _copied_by_model(sys._getframe(1)):
                # A copy the model's code makes (`copy.copy(self.cfg).t`, `deepcopy`,
                # `self.cfg.__getstate__()`): its reads are the copy's, an object no
                # holder knows, so every attribute as `vars` reads them (hunt54: a change
                # after `remat` trained on with the traced value, 1.31 off, silently).
                state = attributes_of(self)
                note(self, "__dict__", {**class_held(type(self), state), **state})
        elif name != "__dict__" or is_model_file(sys._getframe(1).f_code.co_filename):
            # `__dict__` by the model's code only (`vars(self.cfg)`): not remat-ir's own
            # `hasattr(value, "__dict__")`, which made every attribute read (hunt53).
            note(self, name, value)
        elif (holder := holders.get(id(self))) is not None and isinstance(value, dict) \
                and sys._getframe(1).f_locals.get("self") is self and holder[1].count(".") < _DEPTH:
            # A library object's own method handing the forward its tables through its
            # `__dict__` (`self.sched.state_dict()["_last_lr"][0]`), as `get_last_lr()`
            # hands `_last_lr`: the scheduler stepped after `remat`, trained on with the
            # traced rate, silently (hunt62). Its tables only: a count it keeps
            # (`last_epoch`) would plan every step again.
            for key, item in list(value.items()):
                if isinstance(key, str) and (items := plain_items(item)) is not None:
                    reads.containers.setdefault((holder[0], f"{holder[1]}.{key}"), items)
        return value

    def getattr_served(self, name):
        # What a class's `__getattr__` serves from a table of its own (a `ConfigDict`,
        # OmegaConf's `DictConfig`): found by a review, never recorded, so a change after
        # `remat` trained on with the traced value, silently.
        value = fallback(self, name)
        note(self, name, value)
        return value

    cls.__getattribute__ = getattribute
    if fallback is not None:
        cls.__getattr__ = getattr_served


def _own_method_reading(owner) -> bool:
    """Whether the attribute read that `_instrument`'s `getattribute` serves (two frames
    up) is made by a method of `owner` itself (its `self`)."""
    frame = sys._getframe(3)
    code = frame.f_code
    return code.co_argcount > 0 and code.co_varnames[0] == "self" and frame.f_locals.get("self") is owner


#: The standard library's modules copying an object by its state (`__getstate__`).
_COPYING = frozenset({"copy", "copyreg", "pickle"})


def _copied_by_model(frame) -> bool:
    """Whether the code at `frame`, or the model's code calling it through `copy.copy`,
    `copy.deepcopy` or `pickle` (a few frames up), is the model's own."""
    for _ in range(8):
        if frame is None or frame.f_globals.get("__name__") not in _COPYING:
            break
        frame = frame.f_back
    return frame is not None and is_model_file(frame.f_code.co_filename)


#: Attributes every `nn.Module` has for torch's own bookkeeping (its hooks, parameters).
MODULE_KEYS = frozenset(torch.nn.Module().__dict__)


@contextlib.contextmanager
def recording_reads(model: torch.nn.Module, reads: TracedReads):
    """While the block traces `model`, record in `reads` the plain values it reads from
    its modules and the objects they hold (module docstring)."""
    modules = ModulesByDict(model)
    module_class = torch.nn.Module
    original = module_class.__dict__.get("__getattribute__")
    lookup = original or object.__getattribute__
    holders: dict[int, tuple[str, str]] = {}
    #: Classes instrumented, with the `__getattribute__` and `__getattr__` of their own to
    #: put back (None: they had none); builtin classes, which cannot be, map to False.
    originals: dict[type, object] = {}

    def hold(path: str, name: str, value) -> None:
        if id(value) in holders:
            return
        holders[id(value)] = (path, name)
        cls = type(value)
        if (text := describe_called(cls)) is not None:
            # Its class: another object swapped in computes with other methods though it
            # holds the same values (diffusers' `set_attn_processor` after `remat`, a
            # processor of another class: trained on with the traced one, 2.9e-2 off
            # eager's gradients, silently; found by hunt55).
            reads.objects.setdefault((path, name, "__class__"), {FUNCTION: text})
        if users_class(cls):
            reads.classes.add(cls)
        if cls not in originals:
            originals[cls] = (cls.__dict__.get("__getattribute__"), cls.__dict__.get("__getattr__"))
            try:
                _instrument(cls, holders, reads, hold)
            except TypeError:
                originals[cls] = False
        if originals[cls] is False:   # every plain attribute, as it is now
            for key, item in attributes_of(value).items():
                if key.startswith("__"):
                    continue
                if (form := held_form(item)) is not UNRECORDED:
                    reads.objects.setdefault((path, name, key), form)
                elif not key.startswith("_") and (items := plain_items(item)) is not None:
                    reads.containers.setdefault((path, f"{name}.{key}"), items)
                elif not key.startswith("_") and _plain_object(item) and name.count(".") < _DEPTH:
                    # Reads from a builtin object are not seen, so what it holds is held
                    # too (`self.act = Scaler()` whose `__call__` reads
                    # `self.cfg.loss.scale`, cfg a SimpleNamespace): found by a review,
                    # a change after `remat` trained on with the traced value, 2.40 off.
                    hold(path, f"{name}.{key}", item)

    def getattribute(self, name):
        try:
            value = lookup(self, name)
        except AttributeError:
            _note_absent(self, name, modules, written, reads)
            raise
        if name.startswith("__"):
            return value
        path = modules.of(self)[0]
        if path is None or (path, name) in written:
            return value
        own = object.__getattribute__(self, "__dict__")
        if name in own:
            reads.attributes_read.add((path, name))
        if (form := recorded(value)) is not UNRECORDED:
            # Its own attributes, and public class attributes (`self.SCALE`).
            if name in own or not name.startswith("_"):
                reads.modules.setdefault((path, name), form)
        elif (name in own or name == "forward") and is_function(value):
            # A function it holds, or the forward it runs (its class's, or one assigned).
            reads.callables.setdefault((path, name), describe(value))
        elif name in own and (not name.startswith("_") or (
                name not in MODULE_KEYS and in_users_file(type(self).__module__))):
            # Private ones of the user's own classes too (`self._cfg.temp` set by a callback:
            # 0.99 off eager's, silently, review AF); a library's keep bookkeeping there.
            items = plain_items(value)
            if items is not None:
                reads.containers.setdefault((path, name), items)
            elif _plain_object(value):
                hold(path, name, value)
        if name in own:   # `self.sched = Schedule`, or one a table, a partial or a closure holds
            reads.classes.update(classes_within(value))
        return value

    # What the forward assigned before it reads it is its own (Funnel sets its pooling
    # factor at the start of every call): a copy of the model as it was before any call
    # holds another value there, and such a call was refused ("was 1 or 2 when the model
    # was lowered and is None now"). What it reads first and assigns after is recorded.
    written: set[tuple[str, str]] = set()
    module_setattr = module_class.__setattr__

    def setattr_written(self, name, value):
        path = modules.of(self)[0]
        if path is not None:
            written.add((path, name))
        module_setattr(self, name, value)

    module_class.__getattribute__ = getattribute
    module_class.__setattr__ = setattr_written
    try:
        with _recording_environment(reads):
            yield
    finally:
        module_class.__setattr__ = module_setattr
        if original is None:
            del module_class.__getattribute__
        else:
            module_class.__getattribute__ = original
        for cls, own in originals.items():
            if own is False:
                continue
            for name, method in zip(("__getattribute__", "__getattr__"), own):
                if method is not None:
                    setattr(cls, name, method)
                elif name in cls.__dict__:
                    delattr(cls, name)
        _as_left(model, reads, holders)


#: The code between the model's and the environment's `__getitem__` in a read of one
#: variable: `os.environ.get`, `key in os.environ`, `os.getenv` (which calls `get`).
_ONE_VARIABLE = (Mapping.get.__code__, Mapping.__contains__.__code__)


@contextlib.contextmanager
def _recording_environment(reads: TracedReads):
    """While the block runs, record the environment variables the model's code reads
    (`os.environ.get("TEMP")`, `os.getenv`, `in`), as items of the global `os.environ`,
    `ABSENT` where unset: tracing bakes what they chose into the graph, and one set after
    `remat` went on training with the old value, silently."""
    environ_class = type(os.environ)
    getitem = environ_class.__getitem__
    tracing = threading.get_ident()   # not another thread's reads

    def record(environ, key, value) -> None:
        if environ is os.environ and isinstance(key, str) and threading.get_ident() == tracing \
                and _read_by_model(sys._getframe(2)):
            reads.globals.setdefault(("os", "environ", ("item", key)), value)

    def recorded(self, key):
        try:
            value = getitem(self, key)
        except KeyError:
            record(self, key, ABSENT)
            raise
        record(self, key, value)
        return value

    environ_class.__getitem__ = recorded
    try:
        yield
    finally:
        environ_class.__getitem__ = getitem


def _read_by_model(frame) -> bool:
    """Whether the environment's `__getitem__`, called from `frame`, reads one variable
    for the model's code: `os.environ["X"]` there, or `get`, `in` or `os.getenv` called
    there. Not a copy or a walk over every variable (`dict(os.environ)`, `.items()`): the
    graph's metadata would hold them all (tokens among them), and a change of any would
    plan again."""
    if frame.f_code in _ONE_VARIABLE:
        frame = frame.f_back
        if frame is not None and frame.f_code is os.getenv.__code__:
            frame = frame.f_back
    elif not _subscribing(frame):
        return False
    return frame is not None and is_model_file(frame.f_code.co_filename)


def _subscribing(frame) -> bool:
    """Whether `frame` is at a subscript (`os.environ["X"]`), not at a call that reads
    every item from C (`dict(os.environ)`). The instruction at or before `f_lasti`: once
    Python 3.11 has specialized a warm subscript, `f_lasti` points at its last inline
    cache entry, which `dis` does not list (7 of 20 variables a warm helper read were
    recorded when only the exact offset was matched)."""
    current = None
    for instruction in dis.get_instructions(frame.f_code):
        if instruction.offset > frame.f_lasti:
            break
        current = instruction
    return current is not None and current.opname == "BINARY_SUBSCR"


def _note_absent(module: torch.nn.Module, name: str, modules: ModulesByDict, written: set,
                 reads: TracedReads) -> None:
    """Record that the model's code found no attribute `name` on `module` (`hasattr`,
    `getattr` with a default), as `ABSENT`: one set later changes what the forward does.
    transformers' `loss_function` returns `self._loss_function` where the user set one
    (`model.loss_function = my_loss`), else the default loss: set after `remat`, the graph
    went on training with the default, silently. Not recorded: what nn.Module's
    `__getattr__` finds (parameters, buffers, submodules), lookups of a class with a
    `__getattr__` of its own (which may find it), and torch's own probes."""
    path, module = modules.of(module)   # the module itself, not a proxy's class
    if path is None or name.startswith("__") or (path, name) in written:
        return
    if type(module).__getattr__ is not torch.nn.Module.__getattr__:
        return
    own = object.__getattribute__(module, "__dict__")
    if any(name in own.get(table, ()) for table in ("_parameters", "_buffers", "_modules")):
        return
    if is_model_file(sys._getframe(2).f_code.co_filename):
        reads.modules.setdefault((path, name), ABSENT)


def _as_left(model: torch.nn.Module, reads: TracedReads, holders: dict) -> None:
    """A value the forward set while tracing, after reading it, is recorded as either:
    transformers' classification heads set `config.problem_type` on their first call,
    from None to what they read again at every call after; the graph computes what either
    leads to. (A model lowered again keeps what its first tracing set; another instance,
    given a graph lowered from the first, has not set it yet.)"""
    modules = dict(model.named_modules(remove_duplicate=False))
    objects = {holder: attribute_at(modules[holder[0]], holder[1]) for holder in holders.values()}

    def settle(table: dict, key, value) -> None:
        form = recorded(value)
        if form is not UNRECORDED and not (form == table[key] and type(form) is type(table[key])):
            table[key] = {ANY_OF: [table[key], form]}

    for key in reads.modules:
        settle(reads.modules, key, getattr(modules[key[0]], key[1], ABSENT))
    for key in reads.objects:
        settle(reads.objects, key, getattr(objects.get(key[:2]), key[2], None))


def _attribute_chain(value, following: list) -> tuple[str, object] | None:
    """(dotted name, value) of the attributes `following` (the instructions after a global
    is loaded) read from the global `value` through modules, classes and plain objects
    (`CFG.inner.temp`, `cfgmod.sub.T`: recorded one attribute deep, a change of the
    deeper one after `remat` trained on with the traced value, silently); None where the
    first instruction reads no attribute."""
    names, now = [], value
    for instruction in following:
        if instruction.opname not in ("LOAD_ATTR", "LOAD_METHOD") or not (
                isinstance(now, (type, types.ModuleType)) or _plain_object(now)):
            break
        names.append(instruction.argval)
        now = getattr(now, instruction.argval, None)
        if len(names) > _NESTING:
            break
    return (".".join(names), now) if names else None


def _record_global(reads: TracedReads, module: str, name: str, value, following: list,
                   passed: bool = False) -> list:
    """Record what reading global `name` (then `following`, the instructions after) takes
    from it; returns the user's functions it leads to. `passed`: the code uses it as a
    value of its own somewhere (`_passed_names`)."""
    if (form := recorded(value)) is not UNRECORDED:
        reads.globals.setdefault((module, name, None), form)
    elif isinstance(value, torch.Tensor):
        reads.tensors.setdefault(id(value), (module, name, None))
    elif (items := plain_items(value)) is not None:
        for key, item in items:
            if key == LENGTH:
                reads.globals.setdefault((module, name, ("length",)), item)
            elif key == ORDER:
                reads.globals.setdefault((module, name, ("order",)), item)
            elif key == DIGESTED:
                reads.globals.setdefault((module, name, ("digest",)), item)
            elif not isinstance(key, dict):   # a global's item by a described key: not recorded
                reads.globals.setdefault((module, name, ("item", key)), item)
        # The user's functions it holds, whose globals the forward reads through them (a
        # dict of activations reading `SCALE`: changed after `remat`, 3.57 off, hunt67).
        held = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
        return [item for item in itertools.islice(held, HELD_ITEMS)
                if isinstance(item, types.FunctionType) and is_users_file(item.__code__.co_filename)]
    elif (chain := _attribute_chain(value, following)) is not None:
        path, attribute = chain
        if (form := recorded(attribute)) is not UNRECORDED:
            reads.globals.setdefault((module, name, ("attr", path)), form)
        elif isinstance(attribute, types.MethodType) and _plain_object(attribute.__self__):
            # A method of a global object (`ANN.scale(h)`), by its description, which holds
            # what the object holds: `ANN.t = 3.0` computes otherwise.
            reads.globals.setdefault((module, name, ("attr", path)), {FUNCTION: describe(attribute)})
        elif isinstance(attribute, types.MethodType) and isinstance(attribute.__self__, type) \
                and users_class(attribute.__self__):
            # A class method of the user's (`C2.scale(h)`), by its description; the class
            # values its code names are recorded with the class (`_record_reached_classes`).
            reads.globals.setdefault((module, name, ("attr", path)), {FUNCTION: describe(attribute)})
            return [attribute.__func__]
        elif isinstance(attribute, types.FunctionType) and is_users_file(attribute.__code__.co_filename):
            # A function of another of the user's files (`cfgmod.get_temp()`), by its
            # description, its code scanned as one called by name is: a global it returns,
            # changed after `remat`, trained on with the traced value (1.98 off eager's,
            # silently; review AF, 2026-12-02).
            reads.globals.setdefault((module, name, ("attr", path)), {FUNCTION: describe(attribute)})
            return [attribute]
        elif isinstance(value, types.ModuleType) and is_function(attribute):
            # A function of a module the code imported (`F.gelu(h)`), by its description:
            # rebound after `remat` (a kernel patch), the step ran the traced one, 1.8e-3
            # off eager's, silently (found by a review). Compared by identity until it changes.
            reads.globals.setdefault((module, name, ("attr function", path)), describe(attribute))
        elif isinstance(attribute, torch.Tensor):
            reads.tensors.setdefault(id(attribute), (module, name, ("attr", path)))
        elif (items := plain_items(attribute)) is not None:   # `settings.D["temp"]`
            for key, item in items:
                if key == DIGESTED:
                    reads.globals.setdefault((module, name, ("digest", path)), item)
                elif not isinstance(key, dict):
                    reads.globals.setdefault((module, name, ("attr", path, key)), item)
        elif _plain_object(attribute):   # passed along whole: `scale_of(CFG.sub)`
            reads.globals.setdefault((module, name, ("attr", path)), object_form(attribute))
    elif passed and isinstance(value, type) and users_class(value):
        # A class of the user's passed along whole as a config (`scaled(h, Cfg)`, `c =
        # Cfg`): the plain values it holds, each as the attribute read `Cfg.temp` is.
        # Found by hunt54: `Cfg.temp = 3.0` after `remat` trained on with the traced
        # value, 1.31 off, silently. Not where it is called (`Cfg(h)`) nor asked about
        # (`isinstance(x, Cfg)`), whose counters planned every step again (hunt53).
        for attribute, item in sorted(class_held(value).items()):
            if (form := recorded(item)) is not UNRECORDED:
                reads.globals.setdefault((module, name, ("attr", attribute)), form)
    elif _plain_object(value):   # passed along whole: `getattr(CFG, "t", 1.0)`, `scale_of(CFG)`
        reads.globals.setdefault((module, name, None), object_form(value))
    elif is_function(value) and not isinstance(value, types.FunctionType):
        # A builtin under a name of the user's (`act = torch.tanh`), rebound later.
        reads.globals.setdefault((module, name, ("function",)), describe(value))
    elif isinstance(value, types.FunctionType):
        # Its code as it is now: a function patched later (liger-kernel rebinds
        # `modeling_llama.apply_rotary_pos_emb`) computes otherwise than the graph.
        reads.globals.setdefault((module, name, ("function",)), describe(value))
        if is_users_file(value.__code__.co_filename):
            return [value]
        # A library's wrapper of a user's function (`torch.compiler.disable`): the function.
        return [inner for inner in _inner_functions(value) if is_users_file(inner.__code__.co_filename)]
    return []


#: Calls that only ask about a class handed to them, never read what it holds.
_ASKING = frozenset({"isinstance", "issubclass", "type", "super", "id"})


@functools.lru_cache(maxsize=1024)
def _passed_names(code: types.CodeType) -> frozenset[str] | None:
    """The names `code`'s source uses as values of their own: handed to a call
    (`scaled(h, Cfg)`), bound (`c = Cfg`), returned or put in a container; not those only
    called (`Cfg(h)`), read an attribute of (`Cfg.temp`, recorded as such) or asked about
    (`isinstance(x, Cfg)`, `_ASKING`). None where the source cannot be read: any."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(code)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load):
            continue
        parent = parents.get(id(node))
        if isinstance(parent, ast.Attribute) or (isinstance(parent, ast.Call) and parent.func is node):
            continue
        while isinstance(parent, ast.Tuple):   # `isinstance(x, (Box, Cfg))`
            parent = parents.get(id(parent))
        if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id in _ASKING:
            continue
        found.add(node.id)
    return frozenset(found)


def _custom_op_autograd(graph_module: torch.fx.GraphModule | None) -> list:
    """The backward and `setup_context` functions registered (`register_autograd`) for the
    `torch.library.custom_op`s `graph_module`'s graph calls (its regions' too)."""
    found = []
    for definition in custom_op_definitions(graph_module):
        found += [f for f in (definition._backward_fn, definition._setup_context_fn)
                  if f is not None and f not in found]
    return found


def record_globals(model: torch.nn.Module, reads: TracedReads,
                   graph_module: torch.fx.GraphModule | None = None) -> None:
    """Record in `reads` the globals the code of `model`'s module classes reads, in the
    user's own files, and the functions of those files it calls (module docstring).
    `graph_module`: the exported program's module, whose custom ops' registered backwards
    are traced into the graph (`_custom_op_autograd`)."""
    seen: set = set()
    functions_seen: set = set()   # (function, reached) scanned by `scan_function`
    #: The attribute names (and strings) the code that may run in the forward looks up,
    #: and the user's classes it reaches (`_classes_handed`, `reads.classes`).
    looked_up: set[str] = set()
    classes: set[type] = set(reads.classes)

    def scan(code: types.CodeType, namespace: dict, depth: int, reached: bool = True) -> None:
        """`reached`: the code may run in the forward (not `__init__`'s, whose classes
        handed along, `self.sched = Schedule`, are no reads of the step: their counters
        planned every step again; hunt57)."""
        if (code, reached) in seen or depth > _DEPTH:
            return
        seen.add((code, reached))
        remember(namespace)   # the runtime reads these globals from it (`torchlib.namespaces`)
        module = namespace.get("__name__", "")
        instructions = list(dis.get_instructions(code))
        passed = _passed_names(code)
        if reached:
            looked_up.update(_names_looked_up(code))
            classes.update(_named_classes(code, namespace))
        for i, instruction in enumerate(instructions):
            if instruction.opname != "LOAD_GLOBAL" or instruction.argval not in namespace:
                continue
            following = instructions[i + 1:i + 2 + _NESTING]
            if reached:
                classes.update(_classes_handed(namespace[instruction.argval], following))
            for function in _record_global(reads, module, instruction.argval, namespace[instruction.argval],
                                           following, reached and (passed is None or instruction.argval in passed)):
                scan_function(function, depth + 1, reached)
        for constant in code.co_consts:
            if isinstance(constant, types.CodeType):
                scan(constant, namespace, depth, reached)

    def scan_function(function: types.FunctionType, depth: int, reached: bool = True) -> None:
        """`scan` a function of the user's files, and the functions of the user's files a
        decorator's wrapper runs (its `__wrapped__`, its closure's): found by a review, the
        globals of a helper under `functools.wraps` or `torch.compiler.disable` were not
        recorded, nor those of a forward under a decorator of the user's, silently. Each
        once: a nested function calling itself holds itself in its closure (hunt76: a
        RecursionError from here)."""
        if (function, reached) in functions_seen:
            return
        functions_seen.add((function, reached))
        scan(function.__code__, function.__globals__, depth, reached)
        if reached:   # `def by_cls(h, c=D)`
            classes.update(_users_classes([*(function.__defaults__ or ()), *(function.__kwdefaults__ or {}).values()]))
        for inner in _inner_functions(function):
            if is_users_file(inner.__code__.co_filename):
                scan_function(inner, depth + 1, reached)

    def functions_called(code: types.CodeType, namespace: dict) -> None:
        """In a library's code, only the global functions it calls (its constants and
        tables are the library's own)."""
        remember(namespace)
        module = namespace.get("__name__", "")
        for instruction in dis.get_instructions(code):
            if instruction.opname != "LOAD_GLOBAL":
                continue
            value = namespace.get(instruction.argval)
            # A Python function, or a module called like one (`describe_called`).
            if isinstance(value, (types.FunctionType, torch.nn.Module)) \
                    and (text := describe_called(value)) is not None:
                reads.globals.setdefault((module, instruction.argval, ("function",)), text)
            elif _function_registry(value) and (digest := values_digest(value)) is not None:
                # transformers' `LOSS_MAPPING`, `ALL_ATTENTION_FUNCTIONS`: an entry
                # registered again after `remat` (a z-loss, a patched attention) trained
                # on with the traced function, silently (hunt66: 0.17 off eager's loss).
                reads.globals.setdefault((module, instruction.argval, ("digest",)), digest)
        for constant in code.co_consts:
            if isinstance(constant, types.CodeType):
                functions_called(constant, namespace)

    # Its hooks and the functions its modules hold (`self.act = lambda h: ANN.scale(h)`)
    # run in its forward: their code is the model's too. So is the code of the custom
    # autograd Functions it applied: their backward is traced into the graph (and their
    # forward's non-tensor results kept for it), so a global it reads (`g * SCALE`, a
    # dict item, a helper's global) changed after `remat` trained on with the value
    # traced: gradients 0.4x eager's, silently (found by a review).
    held = _held_functions(model, reads.attributes_read)
    # Likewise a `torch.library.custom_op`'s registered backward (a gradient reversal
    # reading its coefficient from a global the loop sets: 6.6e-3 off after a change,
    # silently, where the same code as a Function was compared; found by a review).
    applied = [function for cls in sorted(reads.functions, key=lambda c: (c.__module__, c.__qualname__))
               for function in own_methods(cls)] + _custom_op_autograd(graph_module)
    for function in [*hook_functions(model), *held, *applied]:
        code = getattr(function, "__code__", None)
        if code is None:
            continue
        if is_users_file(code.co_filename):
            scan_function(function, 0)
        elif function in applied and is_model_file(code.co_filename):
            functions_called(code, function.__globals__)
    named: dict[type, set[str]] = {}   # per class, the attribute names its own code looks up
    first: dict[type, tuple[str, torch.nn.Module]] = {}
    for path, module in model.named_modules():
        first.setdefault(type(module), (path, module))
    for cls, (path, module) in first.items():
        named[cls] = set()
        reachable = _forward_reachable(cls)
        for name, function in _own_named_methods(cls):
            code = function.__code__
            if is_users_file(code.co_filename):
                if name not in _NOT_IN_A_STEP:
                    # `__init__` runs no step: a function it stores is the model's code only
                    # where the forward reads it (`_held_functions`). Scanned, a logging
                    # callback's step counter planned every step again (hunt67).
                    scan_function(function, 0, code in reachable)
                named[cls] |= _attribute_names(code)
                if code in reachable:
                    _record_method(reads, path, module, name)
            elif is_model_file(code.co_filename) and code in reachable:
                functions_called(code, function.__globals__)
        looked_up_here = set().union(*(_names_looked_up(code) for code in reachable)) if reachable else set()
        for name, getter in _own_properties(cls):
            # A library's property its forward reads (transformers' `self.loss_function`,
            # which looks `LOSS_MAPPING` up): the functions and tables its getter reads.
            if name in looked_up_here and not is_users_file(getter.__code__.co_filename) \
                    and is_model_file(getter.__code__.co_filename):
                functions_called(getter.__code__, getter.__globals__)
        forward = getattr(cls, "forward", None)
        if isinstance(forward, types.FunctionType) and forward.__module__.startswith("torch.nn."):
            _record_torch_functions(reads, forward.__code__, forward.__globals__)
    classes.update(_record_class_attributes(model, reads, named))
    _record_reached_classes(reads, classes, looked_up)


def _users_classes(values) -> list[type]:
    """The user's classes among `values`."""
    return [value for value in values if isinstance(value, type) and users_class(value)]


def classes_within(value) -> list[type]:
    """The user's classes an object holds hands the forward: itself (`self.sched =
    Schedule`), a table's items (`self.table["c"]`), a partial's arguments, what a
    function's closure and defaults hold (`self.f = make(Cfg)`). Found by hunt60: each
    handed the class to code reading `c.temp`, and `Cfg.temp = 3.0` after `remat` trained
    on with the traced value, 1.74 off, silently. Their values are recorded by the names
    the forward's code looks up (`_record_reached_classes`)."""
    found = [value]
    if isinstance(value, functools.partial):
        found += [*value.args, *value.keywords.values()]
    elif isinstance(value, Mapping):
        found += list(value.values())[:_MAX_ITEMS]
    elif isinstance(value, (list, tuple)):
        found += list(value[:_MAX_ITEMS])
    elif isinstance(value, types.FunctionType):
        found += [cell.cell_contents for cell in value.__closure__ or () if filled(cell)]
        found += [*(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values()]
    return _users_classes(found)


def _named_classes(code: types.CodeType, namespace: dict) -> list[type]:
    """The user's classes the strings of `code` name among the globals it reaches
    (`globals()["Cfg"]`, `getattr(sys.modules[__name__], "Cfg")`, `getattr(cfgmod, "Cfg")`):
    found by hunt60, a change of `Cfg.temp` after `remat` trained on with the traced
    value, silently. In code that looks a module up at run time, its attribute names too
    (`importlib.import_module(__name__).Cfg`, `sys.modules[__name__].Cfg`; hunt62)."""
    names = _all_names(code)
    if not _LOOKS_UP_BY_NAME & names:
        return []   # a string compared or logged names no class it hands over (hunt62: planned every step)
    strings = string_constants(code) | (names if _LOOKS_UP_MODULES & names else set())
    spaces = [namespace, *(vars(value) for value in namespace.values() if isinstance(value, types.ModuleType))]
    return _users_classes(space[name] for space in spaces for name in strings & space.keys())


#: The names code looks a global up by a string with.
_LOOKS_UP_BY_NAME = frozenset({"globals", "getattr", "vars", "__dict__", "import_module", "modules"})
#: The names code looks a module up at run time with.
_LOOKS_UP_MODULES = frozenset({"import_module", "modules"})


def _all_names(code: types.CodeType) -> set[str]:
    """The names `code` and the code nested in it load (globals, attributes, methods)."""
    return set(code.co_names).union(*(_all_names(c) for c in code.co_consts if isinstance(c, types.CodeType)))


def _classes_handed(value, following: list) -> list[type]:
    """The user's classes a global hands the code that loads it (then runs `following`):
    the global itself (`Cfg`, `C2.scale(h)`), the class at the end of its attribute chain
    (`cfgmod.Cfg`), a partial's arguments (`partial(scaled, c=D)`), a table's items
    (`CFGS["a"]`, `CFGT[0]`) (`classes_within`). Found by hunt57: each spelling handed the
    class to code reading `c.temp`, and `D.temp = 3.0` after `remat` trained on with the
    traced value, 0.48-2.27 off, silently."""
    found = classes_within(value)
    if isinstance(value, (type, types.ModuleType)) or _plain_object(value):
        if (chain := _attribute_chain(value, following)) is not None:
            found += _users_classes([chain[1]])
    return found


def _record_reached_classes(reads: TracedReads, classes: set[type], looked_up: set[str]) -> None:
    """Record the class values of the user's `classes` the forward reached whose names its
    code looks up (`looked_up`), as attributes of the global the class is (`cfgmod.Cfg`:
    read again at every call, `runtimes/traced_reads.py`). By name: a counter the loop
    bumps on such a class (`Schedule.step += 1`) that no code of the forward names
    planned again at every step (hunt57). A class no module's globals name (one defined
    in a function) is not recorded."""
    for cls in sorted(classes, key=lambda c: (c.__module__, c.__qualname__)):
        place = _global_place(cls)
        if place is None:
            continue
        module, name, prefix = place
        for attribute, value in sorted(class_held(cls).items()):
            if attribute in looked_up and (form := _class_value_form(value)) is not UNRECORDED:
                reads.globals.setdefault((module, name, ("attr", prefix + attribute)), form)


def _global_place(cls: type) -> tuple[str, str, str] | None:
    """(module name, global name, dotted prefix) where `cls` is found from its module's
    globals (`Outer.Inner`: "Outer", "Inner."), that namespace remembered; None if nowhere."""
    module = sys.modules.get(cls.__module__)
    parts = cls.__qualname__.split(".")
    if module is None or "<locals>" in parts:
        return None
    now = module
    for part in parts:
        now = getattr(now, part, None)
    if now is not cls:
        return None
    remember(vars(module))
    return cls.__module__, parts[0], "".join(f"{part}." for part in parts[1:])


def _class_value_form(value):
    """The form a class value is recorded in: `recorded`, a builtin function (`act =
    torch.tanh`) by its description, a table by its items, a config object by its
    attributes; `UNRECORDED` for anything else (its methods are code, compared as such)."""
    if isinstance(value, staticmethod):   # `act = staticmethod(torch.tanh)`
        value = value.__func__
    if (form := recorded(value)) is not UNRECORDED:
        return form
    if isinstance(value, types.BuiltinFunctionType):
        return {FUNCTION: describe(value)}
    if (items := plain_items(value)) is not None:
        return {NESTED: items}
    if _plain_object(value):
        return object_form(value)
    return UNRECORDED


#: How deep `_held_functions` looks into the containers a module holds, and how many items
#: of them all it looks at.
_HELD_DEPTH = 2
_HELD_FUNCTIONS_AT_MOST = 4096


def _held_functions(model: torch.nn.Module, read: set) -> list[types.FunctionType]:
    """The Python functions `model`'s modules hold in the attributes the forward read
    (`read`: module path, attribute), directly or in their lists, tuples and dicts
    (`self.acts = [make(0), make(1)]`, picked by index), bound methods and partials by
    their function, each code once. hunt65: only functions held directly were scanned, so
    a global read by a function picked from a held list (`h * SCALE`) changed after
    `remat` trained on with the value traced, 2.5 off, silently. hunt67: a logging
    callback a module held and the forward never called, reading the loop's step
    counter, planned every step again and was refused at the fifth."""
    found: dict[types.CodeType, types.FunctionType] = {}
    left = [_HELD_FUNCTIONS_AT_MOST]   # items looked at, all containers together (hunt67: a
    # 3000 x 3000 table of numbers added 1.4 s to `remat()` when each row counted apart)

    def take(value, depth: int) -> None:
        while isinstance(value, functools.partial):
            value = value.func
        if isinstance(value, types.MethodType):
            value = value.__func__
        if isinstance(value, types.FunctionType):
            found.setdefault(value.__code__, value)
        elif depth < _HELD_DEPTH and type(value) in (list, tuple, dict) and left[0] > 0:
            items = value.values() if type(value) is dict else value
            for item in itertools.islice(items, left[0]):
                left[0] -= 1
                take(item, depth + 1)

    for path, module in model.named_modules():
        for name, value in vars(module).items():
            if (path, name) in read:
                take(value, 0)
    return list(found.values())


#: The most entries of a library's table of functions compared at every call.
_REGISTRY_ENTRIES = 256


def _function_registry(value) -> bool:
    """Whether a library's global is a table of functions its code looks up by a key
    (`LOSS_MAPPING[loss_type]`, an attention interface): a mapping of at most
    `_REGISTRY_ENTRIES` entries whose values are Python functions."""
    if not isinstance(value, Mapping) or isinstance(value, types.MappingProxyType):
        return False
    try:
        values = list(itertools.islice(value.values(), _REGISTRY_ENTRIES + 1))
    except Exception:   # noqa: BLE001 - a mapping failing to list its values: not a table read here
        return False
    return 0 < len(values) <= _REGISTRY_ENTRIES and all(isinstance(v, types.FunctionType) for v in values)


#: The Python modules whose functions torch's own layers call as `F.gelu(...)`: a function
#: rebound there after lowering is recorded like a global the user's code calls.
_TORCH_FUNCTION_MODULES = ("torch.nn.functional", "torch")


def _record_torch_functions(reads: TracedReads, code: types.CodeType, namespace: dict, depth: int = 0) -> None:
    """Record in `reads.globals` the functions of `_TORCH_FUNCTION_MODULES` that the code of
    one of torch's layers calls as a module's attribute (`F.gelu` in `nn.GELU.forward`), and
    those that the Python functions of `torch.nn.functional` it so calls call in turn (its
    `multi_head_attention_forward` calls `scaled_dot_product_attention`). hunt66: `F.gelu`
    or `F.scaled_dot_product_attention` rebound after `remat` (a kernel patch) was seen
    where the user's code called it, and trained on with the traced one where torch's
    layers did, silently (3.8e-4 and 0.04 off eager's)."""
    instructions = list(dis.get_instructions(code))
    functional = sys.modules["torch.nn.functional"]
    for instruction, following in zip(instructions, instructions[1:]):
        if instruction.opname != "LOAD_GLOBAL":
            continue
        held = namespace.get(instruction.argval)
        if isinstance(held, types.ModuleType) and held.__name__ in _TORCH_FUNCTION_MODULES \
                and following.opname in ("LOAD_ATTR", "LOAD_METHOD"):
            owner, name = held, following.argval
        elif namespace is vars(functional) and is_function(held):
            owner, name = functional, instruction.argval
        else:
            continue
        value = getattr(owner, name, None)
        if not is_function(value) or (text := describe_called(value)) is None:
            continue
        remember(vars(owner))
        reads.globals.setdefault((owner.__name__, name, ("function",)), text)
        if depth == 0 and isinstance(value, types.FunctionType) and value.__module__ == functional.__name__:
            _record_torch_functions(reads, value.__code__, value.__globals__, depth + 1)


def _inner_functions(function: types.FunctionType) -> list[types.FunctionType]:
    """The functions a decorator's wrapper runs: the one `functools.wraps` names
    (`__wrapped__`) and those its closure holds."""
    found = [getattr(function, "__wrapped__", None)]
    found += [cell.cell_contents for cell in (function.__closure__ or ()) if filled(cell)]
    return list(dict.fromkeys(f for f in found if isinstance(f, types.FunctionType)))


def _record_method(reads: TracedReads, path: str, module: torch.nn.Module, name: str) -> None:
    """Record the method `name` of `module` (at `path`), which its forward may run, as a
    function the module holds: a helper its forward calls through `self` (`self.mix(h)`)
    replaced on the class after `remat`, or edited in its file before a saved module was
    loaded, trained on with the code traced, silently (found by a review: 1.34 where eager
    gives 3.01). `forward` itself is recorded as it is looked up."""
    if name in ("forward", "__init__") or (path, name) in reads.callables:
        return
    try:
        bound = getattr(module, name)
    except Exception:   # a descriptor failing outside a call: nothing to compare with
        return
    if is_function(bound):
        reads.callables[(path, name)] = describe(bound)


def own_classes(cls: type) -> list[type]:
    """The classes of `cls`'s MRO that are not torch's (nor `object`)."""
    return [klass for klass in cls.__mro__
            if not klass.__module__.startswith("torch.") and klass is not object]


def own_methods(cls: type):
    """The Python functions of `cls`'s own classes (`own_classes`): methods, class and
    static methods, decorated ones unwrapped (transformers' `can_return_tuple`: the
    method's own code)."""
    for _, function in _own_named_methods(cls):
        yield function


def own_method_names(cls: type) -> list[str]:
    """The names of `own_methods`, each once: looked up on `cls`, the one its MRO finds."""
    return list(dict.fromkeys(name for name, _ in _own_named_methods(cls)))


def _own_named_methods(cls: type):
    """(name in its class, function) for each of `own_methods`."""
    for klass in own_classes(cls):
        for name, member in vars(klass).items():
            function = getattr(member, "__func__", member)
            function = inspect.unwrap(function) if callable(function) else function
            if isinstance(getattr(function, "__code__", None), types.CodeType):
                yield name, function


def _own_properties(cls: type):
    """(name, getter) for each property of `own_classes` of `cls` with a Python getter."""
    for klass in own_classes(cls):
        for name, member in vars(klass).items():
            if isinstance(member, property) and isinstance(getattr(member.fget, "__code__", None), types.CodeType):
                yield name, member.fget


def _forward_reachable(cls: type) -> set[types.CodeType]:
    """The code of the methods of `cls`'s own classes that its forward may run: `forward`,
    the special methods Python calls without naming them, and each method whose name the
    code reached so far looks up, as an attribute (`self.name`, `super().name`) or as a
    string (`getattr(self, "name")`), transitively. A library's base class has hundreds of
    methods no training step runs (transformers' `PreTrainedModel`: saving, loading, the
    hub, parallelism): the global functions they call were compared at every call, 92 on
    a ResNet, 0.1 ms of its 14 ms CPU step, none of them ever run by its forward."""
    by_name: dict[str, list] = {}
    for name, function in _own_named_methods(cls):
        by_name.setdefault(name, []).append(function)
    todo = [name for name in by_name if name == "forward" or (
        name.startswith("__") and name.endswith("__") and name not in _NOT_IN_A_STEP)]
    done: set[str] = set()
    reached: set[types.CodeType] = set()
    while todo:
        name = todo.pop()
        if name in done:
            continue
        done.add(name)
        for function in by_name[name]:
            reached.add(function.__code__)
            todo.extend(_names_looked_up(function.__code__) & by_name.keys())
    return reached


#: Special methods no forward runs: making, copying, saving and showing an object.
_NOT_IN_A_STEP = frozenset({
    "__init__", "__new__", "__init_subclass__", "__class_getitem__", "__set_name__", "__del__",
    "__repr__", "__str__", "__format__", "__dir__", "__sizeof__", "__reduce__", "__reduce_ex__",
    "__getstate__", "__setstate__", "__copy__", "__deepcopy__"})


def _names_looked_up(code: types.CodeType) -> set[str]:
    """The attribute names and the strings `code` (and the code it nests) holds."""
    return _attribute_names(code) | string_constants(code)


def _record_class_attributes(model: torch.nn.Module, reads: TracedReads, named: dict[type, set[str]]) -> list[type]:
    """Record the plain class attributes of the user's module classes that their code
    names, as attributes of the module's `__class__`: `type(self).T` and
    `self.__class__.T` do not go through the module's `__getattribute__`, so a class
    constant changed after `remat` (`Model.T = 0.5`) trained on with the value traced,
    silently. Found by name in the methods' code (an attribute of another object with
    that name is compared for nothing but a replanning; `named`: per module class, the
    names its methods in the user's files look up). Returns the user's classes among those
    values (`Inner = Cfg` in the class body, read as `type(self).Inner.temp`: hunt62), whose
    own values `_record_reached_classes` records."""
    found: list[type] = []
    for path, module in model.named_modules():
        cls = type(module)
        own = own_classes(cls)
        for name in named[cls]:
            if name.startswith("__"):
                continue
            # The class `getattr(type(module), name)` finds it in, torch's included: a
            # mixin's value shadowed by nn.Module's would differ at every call.
            klass = next((k for k in cls.__mro__ if name in vars(k)), None)
            if klass not in own:
                continue
            # `CFG = SimpleNamespace(t=1.0)` in the class body, read as `self.CFG.t` or
            # passed along: found by a review, changed after `remat` it trained on with the
            # traced value, 0.65 off eager's gradients, silently.
            if (form := _class_value_form(vars(klass)[name])) is not UNRECORDED:
                reads.objects.setdefault((path, "__class__", name), form)
            found += classes_within(vars(klass)[name])
    return found


def _attribute_names(code: types.CodeType) -> set[str]:
    """The attribute names `code` (and the code it nests) looks up."""
    names = {instruction.argval for instruction in dis.get_instructions(code)
             if instruction.opname in ("LOAD_ATTR", "LOAD_METHOD")}
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _attribute_names(constant)
    return names
