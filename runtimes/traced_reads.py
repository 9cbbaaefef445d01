"""The plain values a forward read while it was traced (`frontends/traced_reads.py`),
compared at every training call: the graph computes with the values traced, so a call
after one changed would silently train the old model."""

from __future__ import annotations

import enum
import functools
import json
import operator
import struct
import types
import weakref
from collections.abc import Mapping

import torch

from remat_ir.ir import RematIRError, pb
from remat_ir.torchlib.callables import (attribute_at, attributes_of, describe, describe_called, is_function,
                                         slot_names)
from remat_ir.torchlib.described_values import (ATTRIBUTES, DESCRIBED, DIGEST, FUNCTION, LENGTH, NESTED, ORDER,
                                                PUBLIC_NAMES, TENSOR_LIKE, described, is_tensor_like,
                                                values_digest)
from remat_ir.torchlib.function_state import snapshot as _snapshot, unchanged as _unchanged
from remat_ir.torchlib.held_tensors import digest, global_at, held_at, shown_global
from remat_ir.torchlib.namespaces import AttributeNamespace, namespace
from remat_ir.torchlib.held_tensors import shown as place

#: What `getattr` gives for an attribute a module lacks; also the value recorded for one
#: the forward looked up and did not find (frontends/traced_reads.py `ABSENT`).
_MISSING = "<missing>"
#: The key of a value recorded as either of two (frontends/traced_reads.py `ANY_OF`):
#: one the forward set while it was traced, from the one it read.
_ANY_OF = "any of"


#: The key of the class of an enum member recorded by its description, as found in this
#: process when the plan was made (`TracedReads.pin_classes`).
_CLASS = "class"
#: The key of the module object a table's item held when the plan was made
#: (`TracedReads.pin_classes`), where the item was recorded by its description.
_OBJECT = "object"


def _same(now, lowered) -> bool:
    if isinstance(lowered, dict):
        if DESCRIBED in lowered:   # an enum member, a numpy scalar, a dtype
            return described(now) == lowered[DESCRIBED] and (
                _CLASS not in lowered or type(now) is lowered[_CLASS])
        if NESTED in lowered:   # a container held in one: its items and length
            return isinstance(now, (list, tuple, Mapping)) and items_same(now, lowered[NESTED])
        if ATTRIBUTES in lowered:   # a plain object held in a container: its attributes
            return all(_same(_attribute(now, name), held) for name, held in lowered[ATTRIBUTES])
        if FUNCTION in lowered:   # a global object's method, with what the object holds; an item's function or module
            return (_OBJECT not in lowered or now is lowered[_OBJECT]) and describe_called(now) == lowered[FUNCTION]
        if TENSOR_LIKE in lowered:   # a tensor the forward stores, by its metadata
            return is_tensor_like(now, lowered)
        return any(_same(now, value) for value in lowered[_ANY_OF])
    return type(now) is type(lowered) and _equal(now, lowered)


def _equal(now, lowered) -> bool:
    """`now == lowered` of one type, a float by its bits: -0.0 is not 0.0 where a forward
    divides by it or takes its sign (`atan2`, `copysign`; hunt83 F4: a scale set to -0.0
    after `remat` ran with 0.0, 10.8 off, silently), and a NaN is itself. Through tuples
    and lists, item by item."""
    if type(lowered) is float:
        return struct.pack("<d", now) == struct.pack("<d", lowered)
    if type(lowered) is complex:
        return _equal(now.real, lowered.real) and _equal(now.imag, lowered.imag)
    if type(lowered) in (tuple, list):
        return len(now) == len(lowered) and all(
            type(a) is type(b) and _equal(a, b) for a, b in zip(now, lowered))
    return now == lowered


def bits_matter(lowered) -> bool:
    """Whether `==` can pass a value of `lowered`'s type whose bits differ (`_equal`): a
    zero or NaN float, also inside a complex number, tuple or list. The call guard
    compares such a value through `_same`, any other with `!=`."""
    if type(lowered) is float:
        return lowered == 0.0 or lowered != lowered
    if type(lowered) is complex:
        return bits_matter(lowered.real) or bits_matter(lowered.imag)
    return type(lowered) in (tuple, list) and any(bits_matter(item) for item in lowered)


def _attribute(owner, name: str):
    """`owner.name` as an object's recorded attributes name it (`frontends/traced_reads.py`
    `object_form`): its sorted public attribute names under `PUBLIC_NAMES`."""
    if name == PUBLIC_NAMES:
        return sorted(key for key in attributes_of(owner) if not key.startswith("_")) \
            if hasattr(owner, "__dict__") or slot_names(type(owner)) else _MISSING
    return getattr(owner, name, _MISSING)


def items_same(container, items: list) -> bool:
    """Each of `items` ([key, value] as recorded, the length among them) is `container`'s."""
    found = _items(container)
    return all(_same(_item(found, key), lowered) for key, lowered in items)


def _shown(lowered) -> str:
    if isinstance(lowered, dict):
        if DESCRIBED in lowered:
            return lowered[DESCRIBED]
        if FUNCTION in lowered:
            return lowered[FUNCTION]
        if TENSOR_LIKE in lowered:
            shape, dtype, device = lowered[TENSOR_LIKE]
            return f"a {dtype} tensor of shape {tuple(shape)} on {device}"
        if ATTRIBUTES in lowered:
            return "an object with " + ", ".join(f"{name}={_shown(held)}" for name, held in lowered[ATTRIBUTES]
                                                 if name != PUBLIC_NAMES)
        if NESTED in lowered:
            if (digest := _digest_of(lowered[NESTED])) is not None:
                return digest
            return "{" + ", ".join(f"{_shown(key)}: {_shown(value)}" for key, value in lowered[NESTED]
                                   if not (_is_length(key) or _is_order(key))) + ", ...}"
        return " or ".join(_shown(value) for value in lowered[_ANY_OF])
    return _value_shown(lowered)


def _is_digest(key) -> bool:
    """Whether a recorded item's key is a long container's digest (`plain_items`)."""
    return isinstance(key, dict) and DIGEST in key


def _digest_of(items: list) -> str | None:
    """The digest recorded among a long container's `items`, or None where they are items."""
    return next((value for key, value in items if _is_digest(key)), None)


def _is_length(key) -> bool:
    """Whether a recorded item's key is the container's length (`plain_items`)."""
    return isinstance(key, dict) and LENGTH in key


def _is_order(key) -> bool:
    """Whether a recorded item's key is a dict's keys in their order (`plain_items`)."""
    return isinstance(key, dict) and ORDER in key


def keys_in_order(container) -> list | object:
    """A dict's keys in their order, as `plain_items` records them, else `_MISSING`."""
    return list(container) if isinstance(container, Mapping) else _MISSING


def _value_shown(value) -> str:
    if isinstance(value, str) and value == _MISSING:
        return "missing"
    if is_function(value):
        return describe(value)
    if isinstance(value, type):   # a held object's class, with its `__call__`
        return describe_called(value)
    text = described(value)
    return text if text is not None else repr(value)


def _item(container: Mapping, key):
    """`container`'s item at `key`, or `_MISSING`; a key recorded by its description
    (`{DESCRIBED: text}`: an enum member, a dtype) is looked for among the keys; the
    length key gives its number of items."""
    if isinstance(key, dict):
        if LENGTH in key:
            return len(container)
        if ORDER in key:
            return keys_in_order(container)
        if DIGEST in key:   # a long container (`_items` made a list a dict by index)
            return values_digest(container)
        return next((value for now, value in container.items() if _same(now, key)), _MISSING)
    return container.get(key, _MISSING)


#: Per table of functions (by id): its entries as last digested, and that digest.
_TABLES: dict[int, tuple[list, str | None]] = {}


def _table_digest(table: Mapping) -> str | None:
    """`values_digest` of a mapping, kept while a table of functions holds the same keys,
    functions, code and defaults (transformers' `LOSS_MAPPING`, digested at every call,
    made a tiny Llama's step 12-31% slower than eager's: hunt67). A value set again in a
    function's closure cell is not seen (the table's entries are module functions)."""
    if not all(isinstance(function, types.FunctionType) for function in table.values()):
        return values_digest(table)   # a table of lists or objects changes in place: digested each time
    parts = [part for key, function in table.items()
             for part in (key, function, function.__code__, function.__defaults__)]
    kept = _TABLES.get(id(table))
    if kept is not None and len(kept[0]) == len(parts) and all(map(operator.is_, kept[0], parts)):
        return kept[1]
    made = values_digest(table)
    _TABLES[id(table)] = (parts, made)
    return made


def global_part(value, where) -> object:
    """What a global row (`TracedReads.globals`) reads of the global's `value`: its item
    (["item", key]), its length (["length"]), its attribute (["attr", name]) or that
    attribute's item (["attr", name, key]), or what it returns called (["call"]: the
    rank); `_MISSING` where there is none. The name may
    be dotted, an attribute's attribute (`CFG.inner.temp`)."""
    if where[0] == "item":
        return _items(value).get(where[1], _MISSING)
    if where[0] == "length":
        return len(value) if isinstance(value, (list, tuple, Mapping)) else _MISSING
    if where[0] == "order":
        return keys_in_order(value)
    if where[0] == "digest":   # a long container, the global's or its attribute's
        for name in where[1].split(".") if len(where) == 2 else ():
            value = getattr(value, name, _MISSING)
        return _table_digest(value) if isinstance(value, Mapping) else values_digest(value)
    if where[0] == "call":   # `dist.get_rank()` (frontends/distributed_calls.py)
        try:   # after `destroy_process_group` it raises: no rank (found by a review)
            return value() if callable(value) else _MISSING
        except Exception:   # noqa: BLE001 - whatever it raises, there is no value to compare
            return _MISSING
    now = value
    for name in where[1].split("."):
        now = getattr(now, name, _MISSING)
        if now is _MISSING:
            return _MISSING
    return _items(now).get(where[2], _MISSING) if len(where) == 3 else now


def _items(container) -> Mapping:
    if isinstance(container, Mapping):   # a dict, `os.environ`
        return container
    if isinstance(container, (list, tuple)):
        return dict(enumerate(container))
    return {}


#: Held tensors on the CPU of at most this many bytes are hashed at every call (6-8 us
#: each on CPU): writes through `.data` or a NumPy view bump no version counter, and a
#: loss's class weights re-weighted so between steps trained on with the traced ones,
#: silently (found by a review: 1.4139 where eager gives 1.1864).
_HASHED_AT_EVERY_CALL = 4096


#: Larger held tensors on the CPU, up to this many bytes, are compared at every call with a
#: copy taken when last found equal to the digest (memcmp speed: about 0.1 ms a MiB): a
#: 9.6 KiB table rescaled through `.data` trained on with the traced values, 0.12 off
#: eager's outputs, silently (hunt66). Bigger ones, and those on an accelerator (where
#: comparing would wait for the device), are told changed by version and data pointer
#: alone.
_COMPARED_AT_EVERY_CALL = 16 << 20


def _copy_to_compare(tensor: torch.Tensor) -> torch.Tensor | None:
    """A copy of a held tensor to compare at every call (`_COMPARED_AT_EVERY_CALL`), or None."""
    if tensor.device.type != "cpu" or tensor.nbytes > _COMPARED_AT_EVERY_CALL:
        return None
    return tensor.detach().clone(memory_format=torch.contiguous_format)


def _same_bits(tensor: torch.Tensor, copy: torch.Tensor) -> bool:
    """Whether `tensor` holds `copy`'s bits (a NaN equal to itself, -0.0 not 0.0)."""
    return torch.equal(tensor.detach().contiguous().view(-1).view(torch.uint8), copy.view(-1).view(torch.uint8))


def _seen(tensor) -> tuple[int, int] | None:
    """(version, data pointer) of a held tensor, or None where it is hashed at every
    call: one without a version counter (made under torch.inference_mode), or a small one
    on the CPU (`_HASHED_AT_EVERY_CALL`). The data pointer tells `.data = new`, which
    bumps no version. A larger tensor written through `.data` or NumPy is found by the
    copy compared at every call (`_COMPARED_AT_EVERY_CALL`), on the CPU."""
    if tensor is None or tensor.is_inference() or (
            tensor.device.type == "cpu" and tensor.nbytes <= _HASHED_AT_EVERY_CALL):
        return None
    return tensor._version, tensor.data_ptr()


def _reading_records(method):
    """`method` of `TracedReads`, an error it raises said to come from the records: a value
    recorded in a form this runtime does not know met a raw KeyError deep inside (property
    test of `tests/test_frontend_metadata.py`). Raised as it is, with a note: the model's
    own property raising is said so too (hunt72: a wrapping error hid its type)."""
    @functools.wraps(method)
    def reading(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except RematIRError:
            raise
        except Exception as error:
            error.add_note(
                f"remat-ir: raised comparing the values the forward read while traced "
                f"({', '.join(map(repr, TracedReads.PLAIN))}, 'torch.held_tensors', 'torch.global_tensors' in "
                "the graph) with the model's: reading a value of the model's raised (a property), or a graph "
                "file edited by hand or written by another version of remat-ir records them otherwise (then "
                "lower the model again)")
            raise
    return reading


class TracedReads:
    """The values recorded in a graph's metadata, and `changed`: the first that differs."""

    #: The metadata of plain values (not held tensors): a planner lowers again for new ones.
    PLAIN = ("torch.module_attributes", "torch.module_containers", "torch.object_attributes",
             "torch.global_reads", "torch.module_callables")

    @_reading_records
    def __init__(self, graph: pb.Graph):
        def rows(key):
            return json.loads(graph.metadata.get(key) or "[]")
        #: The plain values as recorded: graphs traced with other values have another key.
        self.key = tuple(graph.metadata.get(key, "") for key in self.PLAIN)
        self.modules = [tuple(row) for row in rows("torch.module_attributes")]
        self.containers = [(path, name, [tuple(item) for item in items])
                           for path, name, items in rows("torch.module_containers")]
        self.objects = [tuple(row) for row in rows("torch.object_attributes")]
        self.globals = [tuple(row) for row in rows("torch.global_reads")]
        #: Functions the modules held or ran as forward: (path, attribute, description).
        self.callables = [tuple(row) for row in rows("torch.module_callables")]
        #: Per function, what it was looked up from when last found to match its description
        #: (`_parts`) and its `_snapshot`: describing costs microseconds, and a model has
        #: one forward per module.
        self._functions: dict[int, tuple] = {}
        #: Per global function row, the function last found to match its description and
        #: its `_snapshot`: a GPT-2's or Llama's classes call about 120 global functions,
        #: and describing them all made `changed` take 171 us per call on a 4-layer GPT-2,
        #: 98 us with this (149 and 82 on a Llama), timed with timeit on CPU.
        self._global_functions: dict[int, tuple] = {}
        #: Tensors the model holds outside parameters and buffers, traced as constants
        #: (frontends/held_tensors.py): (path, attribute, key or None, digest).
        self.held = [tuple(row) for row in rows("torch.held_tensors")]
        #: Tensors of globals traced as constants: (Python module, global, None or
        #: ["attr", name], digest).
        self.global_tensors = [tuple(row) for row in rows("torch.global_tensors")]
        #: Per held place, (a weak reference to the tensor last found equal to the
        #: digest, its `_seen`): that tensor unchanged is not hashed again (an in-place
        #: write bumps the version, `.data = ...` moves the data pointer). By reference,
        #: not `id`: a new tensor assigned after the old one was freed often takes its id
        #: and its memory, at version 0 as the old one, and other values were trained on
        #: with the traced ones, silently (found by a review: loss 0.0836 where eager
        #: gives 1.872).
        #: With it, a copy compared at every call (`_COMPARED_AT_EVERY_CALL`), or None.
        self._verified: dict[int, tuple[weakref.ref, tuple[int, int], torch.Tensor | None]] = {}

    @_reading_records
    def pin_classes(self, at) -> None:
        """Pin the class of each enum member recorded by its description to the class the
        model and the globals hold now (the plan is made for the model as it is): an enum
        class defined again (a notebook cell run again, `importlib.reload`) names its members
        as the old one did, and a forward comparing a member the model holds with the new
        class (`self.kind is Mode.SUM`) takes another branch than traced; by text alone,
        0.92 off eager, silently. Classes are objects of this process, kept here, never
        in the graph (whose metadata keys the plan cache)."""
        def pinned(lowered, now):
            if isinstance(lowered, dict) and DESCRIBED in lowered and isinstance(now, enum.Enum) \
                    and described(now) == lowered[DESCRIBED]:
                return {**lowered, _CLASS: type(now)}
            if isinstance(lowered, dict) and FUNCTION in lowered and isinstance(now, torch.nn.Module) \
                    and describe_called(now) == lowered[FUNCTION]:
                # A module a table holds (`self.route["a"](x)`, `for layer in self.order`):
                # its description names its class and forward, alike for its siblings, and
                # one switched to a sibling or the list reordered after `remat` trained on
                # with the traced weights, silently (3.1 off eager; found by a review). The
                # module itself is compared, as an object of this process: a plan loaded or
                # copied pins the modules its model holds then.
                return {**lowered, _OBJECT: now}
            if isinstance(lowered, dict) and NESTED in lowered and isinstance(now, (list, tuple, Mapping)):
                found = _items(now)
                return {**lowered, NESTED: [[key, pinned(held, _item(found, key))] for key, held in lowered[NESTED]]}
            if isinstance(lowered, dict) and ATTRIBUTES in lowered:   # an object a table holds
                return {**lowered, ATTRIBUTES: [[name, pinned(held, _attribute(now, name))]
                                                for name, held in lowered[ATTRIBUTES]]}
            return lowered

        def held(path, name):
            module = at(path)
            return getattr(module, name, _MISSING) if module is not None else _MISSING

        self.modules = [(path, name, pinned(lowered, held(path, name))) for path, name, lowered in self.modules]
        self.objects = [(path, holder, name, pinned(lowered, getattr(
            attribute_at(at(path), holder), name, _MISSING)))
            for path, holder, name, lowered in self.objects]
        containers = []
        for path, name, items in self.containers:
            found = _items(attribute_at(at(path), name))
            containers.append((path, name, [(key, pinned(lowered, _item(found, key))) for key, lowered in items]))
        self.containers = containers
        rows = []
        for module_name, name, where, lowered in self.globals:
            module = namespace(module_name)
            if module is not None and (where is None or where[0] in ("item", "attr")):
                value = module.get(name, _MISSING)
                lowered = pinned(lowered, value if where is None else global_part(value, where))
            rows.append((module_name, name, where, lowered))
        self.globals = rows

    def changed(self, at) -> str | None:
        """What differs from lowering, said for the user, or None. `at(path)`: the model's
        submodule at a dotted path (None if it has none)."""
        plain = self.plain_changed(at)
        return plain[1] if plain is not None else self.held_changed(at)

    @_reading_records
    def plain_changed(self, at) -> tuple[str, str, str] | None:
        """(where, what, value) for the first plain value (a module's attribute, an item of
        its container, an attribute of an object it holds, a function it holds or runs as
        forward, a global) that differs from lowering: where it is read, what differs, said
        for the user, and the value it has now, shown; or None."""
        root = type(at("")).__name__
        for path, name, lowered in self.modules:
            module = at(path)
            now = getattr(module, name, _MISSING) if module is not None else _MISSING
            if not _same(now, lowered):
                return _differs(f"module attribute {f'{path}.{name}' if path else name!r} of {root}",
                                lowered, now)
        for path, name, items in self.containers:
            module = at(path)
            container = _items(attribute_at(module, name) if module is not None else None)
            for key, lowered in items:
                now = _item(container, key)
                if not _same(now, lowered):
                    where = f"{path}.{name}" if path else name
                    where = f"len({where})" if _is_length(key) else where if _is_digest(key) else \
                        f"{where} (its keys' order)" if _is_order(key) else f"{where}[{_shown(key)}]"
                    return _differs(f"{where} of {root}", lowered, now)
        for index, (path, name, lowered) in enumerate(self.callables):
            module = at(path)
            held = _parts(module, name)
            last = self._functions.get(index)
            function = held[1] if held[2] is None else held[2]
            if last is not None and last[0] is held[0] and last[1] is held[1] and last[2] is held[2] \
                    and _unchanged(function, last[3]):
                continue   # the objects described last time: not described again
            now = getattr(module, name, None) if module is not None else None
            if not is_function(now) or describe(now) != lowered:
                self._functions.pop(index, None)
                shown = describe(now) if is_function(now) else repr(now)
                return _differs(f"function {f'{path}.{name}' if path else name!r} of {root}",
                                lowered, shown, quoted=False)
            self._functions[index] = (*held, _snapshot(function))
        for path, holder, name, lowered in self.objects:
            module = at(path)
            owner = attribute_at(module, holder) if module is not None else None
            now = getattr(owner, name, _MISSING)
            if not _same(now, lowered):
                if holder == "__class__" and owner is not None:   # `type(self).T` (frontends/traced_reads.py)
                    return _differs(f"class attribute {owner.__qualname__}.{name}", lowered, now)
                return _differs(f"{f'{path}.{holder}' if path else holder}.{name} of {root}",
                                lowered, now)
        for index, (module_name, name, where, lowered) in enumerate(self.globals):
            module = namespace(module_name)
            if module is None:   # not imported in this process: nothing to compare with
                continue
            value = module.get(name, _MISSING)
            if where is None:
                now, shown = value, name
            elif where[0] in ("function", "attr function"):
                # A function the code calls (a module's: `F.gelu`), by its description.
                function = value if where[0] == "function" else global_part(value, ("attr", where[1]))
                last = self._global_functions.get(index)
                if last is not None and last[0] is function and _unchanged(function, last[1]):
                    continue   # the function described last time: not described again
                now = describe_called(function) or _value_shown(function)
                if now != lowered:
                    self._global_functions.pop(index, None)
                    what = (f"function {name}.{where[1]}" if where[0] != "function" else f"function {name}"
                            if isinstance(module, AttributeNamespace) else f"global function {name}")
                    return _differs(f"{what} of {module_name}", lowered, now, quoted=False)
                self._global_functions[index] = (function, _snapshot(function))
                continue
            else:
                now = global_part(value, where)
                shown = (f"{name}[{where[1]!r}]" if where[0] == "item" else f"len({name})"
                         if where[0] == "length" else f"{name} (its keys' order)" if where[0] == "order"
                         else f"{name}()" if where[0] == "call" else
                         ".".join([name, *where[1:]]) if where[0] == "digest" else f"{name}.{where[1]}"
                         + (f"[{where[2]!r}]" if len(where) == 3 else ""))   # `settings.D["temp"]`
            if not _same(now, lowered):
                if (module_name, name) == ("os", "environ"):
                    return _differs(f"environment variable {where[1]}", lowered, now)
                if where and where[0] == "call":
                    return _differs(f"the rank the forward reads ({module_name}.{name}())", lowered, now)
                return _differs(f"global {shown} of {module_name}", lowered, now)
        return None

    def held_changed(self, at) -> str | None:
        """`changed` for the tensors the model, or a global, holds outside parameters and
        buffers."""
        change = self.held_change(at)
        return change[1] if change is not None else None

    @_reading_records
    def held_change(self, at) -> tuple[str, str, str | None] | None:
        """(where, what, the digest of what it holds now, None if gone) for the first tensor
        the model, or a global, holds outside parameters and buffers that differs from
        lowering; None where none does."""
        for index, row in enumerate(self.held + self.global_tensors):
            if index < len(self.held):
                path, name, key, lowered = row
                now = held_at(at(path), name, key)
            else:
                module, name, where, lowered = row
                now = global_at(module, name, where)
            if now is not None and now.requires_grad:
                # Lowering refuses one that does; `requires_grad_()` since (or a computed
                # tensor of the same values assigned) gets a gradient in eager, and none
                # from the graph's constant: silently, before (found by a review).
                shown = self._held_shown(index, row, at)
                return shown, (f"tensor {shown}, which the graph holds as a "
                               f"constant, requires a gradient now and did not when the model was lowered "
                               f"(make it an nn.Parameter before remat_ir.remat if it is trained, or assign "
                               f"it without requires_grad: `tensor.detach()`)"), "requires a gradient"
            seen = _seen(now)
            verified = self._verified.get(index)
            if seen is not None and verified is not None and verified[0]() is now and verified[1] == seen \
                    and (verified[2] is None or _same_bits(now, verified[2])):
                continue
            if now is None or (now_digest := digest(now)) != lowered:
                self._verified.pop(index, None)
                state = "is gone" if now is None else "holds other values than it held"
                shown = self._held_shown(index, row, at)
                return shown, (f"tensor {shown}, which the graph holds as a "
                               f"constant, {state} when the model was lowered{_on_rank_zero()} (register "
                               f"it as a buffer to have it read at every call)"), \
                    None if now is None else now_digest
            if seen is not None:
                self._verified[index] = (weakref.ref(now), seen, _copy_to_compare(now))
        return None

    def _held_shown(self, index: int, row: tuple, at) -> str:
        """Where held row `index` of `held_changed` is, said for the user (only when it
        differs: not made for every tensor at every call)."""
        if index < len(self.held):
            path, name, key, _ = row
            return f"{place(path, name, key)} of {type(at('')).__name__}"
        module, name, where, _ = row
        return shown_global(module, name, where)


def _on_rank_zero() -> str:
    """Where the model was lowered, under torch.distributed: rank 0 lowers for every rank
    whose inputs agree with its own, so on another rank a tensor that differs per rank
    (a rank's seed, its shard of a table) "changed" though its rank never wrote it."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return ""
    return f" (on rank 0, which lowers the model for every rank; this is rank {dist.get_rank()})"


def _parts(module, name: str) -> tuple:
    """What `module.name` is looked up from, compared by identity at the next call: the
    module, what its own dictionary holds under `name` and, where it holds nothing, its
    class's attribute (a method, which `getattr` would bind anew at every lookup, 1 us
    per module and call). The same function object may compute otherwise when a closure
    cell was rebound (`nonlocal scale; scale = 3.0`): compared by the function alone, the
    step kept the traced value, silently (2026-11-30), so what the cells of a closure
    hold is compared too (`_closure`, `_holding`)."""
    if module is None:
        return (None, None, None)
    own = vars(module).get(name, _MISSING)
    return module, own, getattr(type(module), name, None) if own is _MISSING else None


def _attribute_shown(now, held) -> str:
    """An attribute of an object a table holds, now, as `_shown` says the recorded one."""
    if isinstance(held, dict) and FUNCTION in held:   # its class
        return describe_called(now) or _value_shown(now)
    if isinstance(held, dict) and NESTED in held and _digest_of(held[NESTED]) is not None:
        return str(values_digest(now))   # a long container
    return _value_shown(now)


def _differs(where: str, lowered, now, quoted: bool = True) -> tuple[str, str, str]:
    shown = now if not quoted else _value_shown(now)   # descriptions are said as they are
    if quoted and isinstance(lowered, dict) and ATTRIBUTES in lowered:   # the attributes that changed
        then = dict(lowered[ATTRIBUTES]).get(PUBLIC_NAMES, [])
        added = [name for name in _attribute(now, PUBLIC_NAMES) if name not in then] \
            if PUBLIC_NAMES in dict(lowered[ATTRIBUTES]) and _attribute(now, PUBLIC_NAMES) is not _MISSING else []
        changed = [(name, held) for name, held in lowered[ATTRIBUTES]
                   if name != PUBLIC_NAMES and not _same(_attribute(now, name), held)]
        if changed or added:
            # Only what changed: an object of many fields (transformers' `TrainingArguments`)
            # was shown whole, cut before the field that changed (found by a review).
            shown = "an object with " + ", ".join(
                [f"{name}={_attribute_shown(_attribute(now, name), held)}" for name, held in changed]
                + [f"{name}={_value_shown(getattr(now, name, _MISSING))}" for name in added])
            before = "an object with " + ", ".join(
                [f"{name}={_shown(held)}" for name, held in changed] + [f"no {name}" for name in added])
            before, after = _around_difference(before, shown)
            return where, f"{where} was {before} when the model was lowered and is {after} now", shown
        shown = "an object with " + ", ".join(
            f"{name}={_attribute_shown(_attribute(now, name), held)}" for name, held in lowered[ATTRIBUTES]
            if name != PUBLIC_NAMES)
    if isinstance(lowered, dict) and _CLASS in lowered and type(now) is not lowered[_CLASS] \
            and described(now) == lowered[DESCRIBED]:
        shown += f" (of another class {type(now).__qualname__}, defined since)"
    if isinstance(lowered, dict) and _OBJECT in lowered and now is not lowered[_OBJECT] \
            and describe_called(now) == lowered[FUNCTION]:
        shown = f"another {type(now).__qualname__} module"
        return where, f"{where} holds {shown} than when the model was lowered", shown
    before, after = _around_difference(str(lowered if not quoted else _shown(lowered)), str(shown))
    return where, f"{where} was {before} when the model was lowered and is {after} now", shown


#: The longest value a notice shows whole; longer ones are shown around where they differ.
_SHOWN_WHOLE = 240


def _around_difference(lowered: str, now: str, context: int = 60) -> tuple[str, str]:
    """`lowered` and `now` as a notice shows them: whole where short, else each from a
    little before the first character where they differ, elided ("…"). Why: a config a
    forward read (peft's AdaLoRA `rank_pattern`, rewritten by `update_and_allocate`) was
    shown whole, twice, 2.3 to 3.5 KB on one line, the change lost in it (found by a
    review)."""
    if len(lowered) <= _SHOWN_WHOLE and len(now) <= _SHOWN_WHOLE:
        return lowered, now
    start = next((i for i, (a, b) in enumerate(zip(lowered, now)) if a != b), min(len(lowered), len(now)))
    first = max(0, start - context)

    def cut(text: str) -> str:
        end = start + context
        return ("…" if first else "") + text[first:end] + ("…" if end < len(text) else "")
    return cut(lowered), cut(now)
