"""What a forward does besides computing tensors: tracing runs it once, the graph keeps none
of it, so the frontend refuses it by name.

- Python's and NumPy's random generators: a number drawn while tracing is a constant of the
  graph (a layer-drop branch on `random.random()` took, at every step, the branch drawn at
  tracing: gradients 0.78 off eager's wherever eager took the other). The first draw of
  the model's code is named by line (`_noting_draw`), with the config to change where it
  is transformers' SpecAugment (speech models mask time steps with NumPy while training).
  A number from Python's `random()` or `uniform()` that only comparisons its range decides
  read (LayerDrop at 0.0) is no such constant: it is lowered, and the runtime draws as
  many at every step (`python_draws`).
- torch's generator set or read by the model's own code (`torch.manual_seed`,
  `get_rng_state`/`set_rng_state`, `fork_rng`): the graph's random ops draw from the
  generator as the step runs; the forward's seeding or restoring ran once, at tracing.
  (torch's own callers, such as `torch.utils.checkpoint` saving the state, are left alone.)
- Module attributes the forward assigns or appends to (a step counter, `self.aux_loss = ...`,
  a list of logged values): the assignment ran once, while tracing; a tensor assigned was a
  tracing placeholder, left on the model, on which a loss then "trained" without error.
  They are put back as they were before tracing; tracing placeholders the forward left
  outside the modules (a global list of auxiliary losses) are taken out and named
  (`outside_state`), and plain values it changed in the user's globals and closures are
  told, by tracing again, a counter from a first call's setup (`outside_values`).
  Private attributes (`self._step += 1`)
  are refused where the user's own code assigns them; installed libraries keep private
  bookkeeping on modules that tracing may set (transformers marks with one that it
  installed the hooks that capture hidden states, once), which is left to them.
  Assigning the object an attribute holds already is no effect (a module cast that
  changes nothing, `self.classifier = self.classifier.to(self.dtype)`: `module_casts`).
  A plain value (a number, a string, None) assigned is not refused yet: the frontend
  traces again with it assigned (`assigned`), as eager's first call would leave it, and
  refuses it only if the forward then assigns another value (a counter) or traces
  another program (it computed with the value before assigning it). A value set from
  shapes alone before it is used settles: transformers' Swin clamps its last stage's
  window and shift to the input's resolution at every call, and was refused before.

Where the model's own code uses `.data` while tracing (reading it, writing through it,
assigning it), each use is noted on the error if torch.export then fails (`data_uses`):
`.data` hands out a tensor that tracing does not follow, and export's own error for it
("a fake tensor in the exported program constant's list ... file an issue") named
neither `.data` nor the line. A parameter's `.data` is handed out as its `.detach()`
instead, which tracing follows: the same values for a read (peft's HRA), and a write
through it is a parameter written in place, which lowering refuses by name.
"""

from __future__ import annotations

import array
import collections
import contextlib
import copy
import functools
import hashlib
import inspect
import math
import os
import random
import re
import struct
import sys
import types
import warnings

import torch

from remat_ir.torchlib.callables import users_class
from remat_ir.torchlib.function_state import underlying
from remat_ir.torchlib.generators import PythonGenerators, same_state
from remat_ir.torchlib.hooks import forward_hooks
from remat_ir.torchlib.hook_reparametrizations import hook_reparametrizations

from .argument_writes import noting_argument_writes
from .autograd_state import noting_autograd_state
from .backend_flags import noting_backend_flags
from .cached_functions import cached_functions_traced
from .constant_tensors import CallDerived, call_sources
from .fresh_generators import fresh_generators_noted
from .held_tensors import held_objects
from .hook_registrations import noting_hook_registrations
from .python_draws import RANGES, RangedDraw
from .sdpa_kernels import tracing_own_sdpa_kernels
from .stored_tensors import StoredTensors
from .model_lines import in_users_file, is_model_file, is_users_file, model_caller, past_passing
from . import outside_state
from .outside_state import generator_state, holds_placeholder, iterator_state, restore_generator
from .traced_reads import MODULE_KEYS as _MODULE_KEYS, ModulesByDict, plain

#: torch's generator functions a forward may call, by module and name.
#: `initial_seed` too: a forward computing with it (a per-run salt) computed every step
#: with the seed read at tracing, 0.27-0.39 off eager's after a reseed (review AF).
_TORCH_RNG = [(torch, "manual_seed"), (torch, "seed"), (torch, "get_rng_state"),
              (torch, "set_rng_state"), (torch, "initial_seed"), (torch.random, "manual_seed"),
              (torch.random, "seed"), (torch.random, "get_rng_state"), (torch.random, "set_rng_state"),
              (torch.random, "initial_seed"), (torch.random, "fork_rng")]


#: The effect said where torch's generator moved while tracing with no seed set.
_DRAWN_FOR_REAL = ("it draws from torch's generator where tracing runs the draw for real, as for a draw "
                   "read as a Python number (`.item()`, `float()` of a torch.distributions sample: one "
                   "number would be drawn for every step); keep the draw a tensor (`lam = "
                   "Beta(a, a).sample()` scales as the number does)")


#: The containers a module attribute may be, changed in place by a forward: a deque too
#: (a sliding window appended to at every call trained on with the traced length, 3.22
#: off eager's loss, silently: found by a review).
_SEQUENCES = (list, collections.deque)
_CONTAINERS = (*_SEQUENCES, dict, set)


def _attribute_state(model: torch.nn.Module) -> dict:
    """(module path, attribute) -> (the value, a copy of a list's, dict's or set's items),
    of the public attributes, and of the private containers of the user's own classes
    (`self._stats["n"] += 1`: 0.23 off eager's, silently, before; a library's modules
    keep private bookkeeping of their own)."""
    state = {}
    for path, module in model.named_modules():
        users = in_users_file(type(module).__module__)
        for key, value in vars(module).items():
            if key in _MODULE_KEYS or (key.startswith("_") and not (
                    users and (isinstance(value, _CONTAINERS) or plain(value)
                               or (_array(value) and not _of_objects(value))))):
                continue
            items = value.copy() if isinstance(value, _CONTAINERS) else _ArrayState(value) if _array(value) else None
            state[(path, key)] = (value, items)
    return state


#: Arrays larger than this are compared by a digest of their bytes, not a copy, and
#: cannot be put back (hunt79: a counter in a 2.4 MB array was not looked at, 8.8 off).
_ARRAY_BYTES = 1 << 26


class _ArrayState:
    """A NumPy array's, `array.array`'s or `bytearray`'s contents before tracing (hunt77 F8:
    a counter kept in one, `self.n[0] += 1`, changed in place and went unseen: every step
    ran with the count tracing read, 0.23 off eager's loss, silently): its bytes, a digest
    of them past `_ARRAY_BYTES`, or the references an array of objects holds (hunt79 F6:
    put back as bytes, one crashed)."""

    def __init__(self, value):
        self.objects = value.copy() if _of_objects(value) else None
        self.data = None if self.objects is not None else self._bytes(value)

    @staticmethod
    def _size(value) -> int:
        return value.nbytes if hasattr(value, "nbytes") else len(value) * getattr(value, "itemsize", 1)

    @classmethod
    def _bytes(cls, value) -> bytes:
        if cls._size(value) > _ARRAY_BYTES:
            numpy = sys.modules.get("numpy")
            data = numpy.ascontiguousarray(value) if hasattr(value, "dtype") else value
            return hashlib.blake2b(memoryview(data).cast("B")).digest()
        return value.tobytes() if hasattr(value, "tobytes") else bytes(value)

    def changed(self, after) -> bool:
        if self.objects is not None:
            return after.shape != self.objects.shape or any(
                a is not b for a, b in zip(self.objects.flat, after.flat))
        return self._bytes(after) != self.data

    def put_back(self, value) -> None:
        """Its contents again, in place (a digest's cannot be: left as the trace left it)."""
        if self.objects is not None:
            value[...] = self.objects
        elif self._size(value) <= _ARRAY_BYTES:
            if isinstance(value, bytearray):
                value[:] = self.data
            elif isinstance(value, array.array):
                value[:] = array.array(value.typecode, self.data)
            else:
                value[...] = sys.modules["numpy"].frombuffer(self.data, dtype=value.dtype).reshape(value.shape)


def _array(value) -> bool:
    """An `array.array`, a `bytearray` or a NumPy array."""
    numpy = sys.modules.get("numpy")
    return isinstance(value, (array.array, bytearray)) or (numpy is not None and isinstance(value, numpy.ndarray))


def _of_objects(value) -> bool:
    """A NumPy array of objects (its bytes are references)."""
    return _array(value) and getattr(getattr(value, "dtype", None), "hasobject", False)


def _changed(before: tuple, after, tensors: bool = True, derived=None) -> bool:
    """Whether a list, dict or set attribute was changed in place since before tracing:
    grown or shrunk (a log appended to), or an item replaced (`self.log[0] = x`). Without
    `tensors` (a private one), a lazy cache of tensors filled where it held nothing
    (`self._cache[n] = torch.cos(...)`) is no change: the graph computes it at every step.
    But an activation (a tensor needing a gradient: `self._feats["h"] = h`, kept for a
    loss outside the forward), a tensor replacing one the dict held, or a list of tensors
    grown (a MoCo queue) is state no training step fills or updates: a loss read a warm-up
    call's activation at every step (1.4e-2 off), and a queue stayed empty (0.41 off),
    silently (found by reviews). Nor a cache of tensors computed from what a call brings
    (`derived`: `CallDerived.derived`), a memory filled at the first call with what it
    computed from its inputs (0.46 off). An attribute assigned anew is noted as the
    forward assigns it (`refusing_trace_effects`)."""
    value, items = before
    if items is None or after is not value:
        return False
    if isinstance(items, _ArrayState):
        return items.changed(after)
    if not tensors:
        differing = _differing(items, after)
        if any(not isinstance(item, torch.Tensor) or item.requires_grad
               or (derived is not None and derived(item)) for item in differing):
            return True
        if isinstance(items, dict):   # a cache fills keys it did not hold
            return any(key not in after or not _same(item, after[key]) for key, item in items.items())
        return bool(differing)
    if len(items) != len(after) or (isinstance(items, dict) and items.keys() != after.keys()):
        return True
    if isinstance(items, _SEQUENCES):
        return any(not _same(a, b) for a, b in zip(items, after))
    return isinstance(items, dict) and any(not _same(items[key], after[key]) for key in items)


def _same(item, now) -> bool:
    """Whether a list's or dict's item is what it held: the same object, or a plain number
    or string of the same type and bits. diffusers' `apply_lora_scale` multiplies each
    LoRA layer's `scaling` item by the call's `scale` and divides it back after: equal, a
    new float, and taken for a change, it refused a UNet trained with
    `cross_attention_kwargs={"scale": 0.5}` (found by hunt55)."""
    if item is now:
        return True
    if type(item) is not type(now) or type(item) not in (int, float, bool, str):
        return False
    return struct.pack("<d", item) == struct.pack("<d", now) if type(item) is float else item == now


def _replaced_unseen(module: torch.nn.Module, key: str, before, through_setattr: set) -> bool:
    """Whether the forward replaced `module.key` (which held `before`) other than through
    `nn.Module.__setattr__`, which notes what it assigns (hunt77 F7: a counter written
    through `self.__dict__` or `object.__setattr__` ran with its traced value at every
    step, 0.03 off eager's weights after two, silently)."""
    after = vars(module).get(key, MISSING)
    if after is before or (id(module), key) in through_setattr:
        return False
    return not (plain(after) and type(after) is type(before) and after == before)


def _change_said(key: str, path: str, before: tuple) -> str:
    """The effect of a change to a module's list or dict attribute, as `found` says it;
    for tensors kept there, what to do instead."""
    value, items = before
    if isinstance(items, _ArrayState):
        return (f"it changes the {type(value).__name__} in module attribute {key!r} of {path or '<root>'} in "
                f"place (a counter?), which the graph holds as the values tracing read: keep it outside "
                f"the forward, or in a buffer written in place (`self.count.add_(1)`)")
    kept = key.startswith("_") and items is not None and any(
        isinstance(item, torch.Tensor) for item in _differing(items, value))
    if kept:
        return (f"it keeps tensors in module attribute {key!r} of {path or '<root>'}, which no "
                f"training step fills (keep what the forward reads back in local variables, "
                f"and return what the loss needs from the forward)")
    if _public_cache(key, items, value):
        return (f"it fills module attribute {key!r} of {path or '<root>'} with tensors at keys it did not "
                f"hold, which no training step fills: for a cache per shape of tensors made from "
                f"constants, name it as a private attribute (`self._{key}`), which remat-ir takes as a "
                f"cache the graph computes at every step, or call the model once with each shape "
                f"before remat_ir.remat; for statistics or activations read after the call, return "
                f"them from the forward")
    if _rounded_back(items, value):
        return (f"it changes module attribute {key!r} of {path or '<root>'} in the last bits of a number "
                f"(multiplied and divided back, as diffusers' LoRA `scale` does; call the model once "
                f"before remat_ir.remat, after which the number stays)")
    flags = _flags_set(items, value)
    if flags:
        return (f"it changes module attribute {key!r} of {path or '<root>'} ({flags}): a flag its first "
                f"call sets? Call the model once before remat_ir.remat, or keep the flag in a plain "
                f"attribute (`self.inited = True`), whose first-call setup remat-ir replays; a counter "
                f"or a log: keep it outside the forward")
    return f"it changes module attribute {key!r} of {path or '<root>'}"


def _public_cache(key: str, items, after) -> bool:
    """Whether a public dict only gained keys, each holding a tensor needing no gradient:
    a cache, which the rule for private ones would take (hunt80 F4: a mask per length in
    `self.cache` was refused as "it changes module attribute", no more said)."""
    if key.startswith("_") or not (isinstance(items, dict) and isinstance(after, dict)):
        return False
    if any(k not in after or not _same(item, after[k]) for k, item in items.items()):
        return False
    added = [after[k] for k in after if k not in items]
    return bool(added) and all(isinstance(t, torch.Tensor) and not t.requires_grad for t in added)


def _flags_set(items, after) -> str:
    """The items of a dict attribute that the forward changed from one plain value to
    another, said (`item 'inited': False, then True`); "" where any other item changed.
    hunt61: a first call's flag in a dict was said as an attribute changed, and no more."""
    if not (isinstance(items, dict) and isinstance(after, dict) and items.keys() == after.keys()):
        return ""
    changed = [(key, items[key], after[key]) for key in items if not _same(items[key], after[key])]
    if not changed or not all(plain(a) and plain(b) for _, a, b in changed):
        return ""
    return "; ".join(f"item {key!r}: {a!r}, then {b!r}" for key, a, b in changed[:3])


def _rounded_back(items, after) -> bool:
    """Whether the only items of a dict or list that changed are floats now a few units in
    the last place off what they were: a number the forward scales and scales back (found
    by hunt55: LoRA r=3, alpha=5, `scale` 0.7 leaves 5/3 one unit off at the first call,
    and there it stays)."""
    if isinstance(items, dict) and isinstance(after, dict) and items.keys() == after.keys():
        pairs = [(items[key], after[key]) for key in items]
    elif isinstance(items, _SEQUENCES) and isinstance(after, _SEQUENCES) and len(items) == len(after):
        pairs = list(zip(items, after))
    else:
        return False
    changed = [(a, b) for a, b in pairs if not _same(a, b)]
    return bool(changed) and all(type(a) is float and type(b) is float and a != b and abs(a - b) <= 4 * math.ulp(a)
                                 for a, b in changed)


def _differing(items, after) -> list:
    """The items of `after` (or of `items`, removed) that are not what `items` held."""
    if isinstance(items, dict):
        keys = set(items) | set(after)
        return [after.get(k, items.get(k)) for k in keys if not _same(items.get(k, MISSING), after.get(k, MISSING))]
    if isinstance(items, _SEQUENCES):
        longer = after if len(after) >= len(items) else items
        return [longer[i] for i in range(len(longer))
                if i >= min(len(items), len(after)) or not _same(items[i], after[i])]
    return list(set(items) ^ set(after))


def _restore(module: torch.nn.Module, key: str, before: tuple) -> None:
    value, items = before
    if isinstance(items, _ArrayState):
        items.put_back(value)
    elif items is not None:
        value.clear()
        (value.extend if isinstance(value, _SEQUENCES) else value.update)(items)
    object.__setattr__(module, key, value)


#: The attribute of an error raised while tracing that lists the model's `.data` uses.
_DATA_USES = "_remat_ir_data_uses"


def data_uses(exc: BaseException) -> list[tuple[str, int, str]]:
    """(file, line, function) of each place the model's own code used `.data` while the
    trace that raised `exc` ran, first first (`refusing_trace_effects`)."""
    return getattr(exc, _DATA_USES, [])


@contextlib.contextmanager
def _noting_data_uses(found: list[tuple[str, int, str]], model: torch.nn.Module, effects: list[str]):
    """While the block runs, note in `found` where the model's own code reads or assigns
    a tensor's `.data` (through `torch.Tensor`, shadowing TensorBase's descriptor, which
    stays what the access runs). An assignment to a parameter's or buffer's `.data` is
    an effect (`effects`): the traced step computes with the tensor the call began with
    and carries no new one back. A max-norm constraint written as
    `self.weight.data = torch.renorm(self.weight, 2, 0, c)` (braindecode's EEGNet) was
    lost, silently: losses 3x eager's, the weight never renormed (found by a review)."""
    descriptor = torch._C.TensorBase.data
    own = vars(torch.Tensor).get("data")

    def note():
        frame = past_passing(sys._getframe(2))
        if is_model_file(frame.f_code.co_filename):
            found.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))

    def member(tensor) -> str | None:
        for path, module in model.named_modules():
            for kind, held in (("parameter", module._parameters), ("buffer", module._buffers)):
                for name, value in held.items():
                    if value is tensor:
                        return f"{kind} {f'{path}.' if path else ''}{name}"
        return None

    def get(tensor):
        if isinstance(tensor, torch.nn.Parameter):
            # A parameter's `.data` read is its `.detach()`, which tracing follows (peft's HRA
            # reads its frozen base weight so); a write through it is a parameter written
            # in place, which lowering refuses by name.
            return tensor.detach()
        note()
        return descriptor.__get__(tensor)

    def assign(tensor, value):
        note()
        written, where = member(tensor), model_caller(1)
        if written is not None and where is not None and not _same_tensor_data(tensor, value):
            effects.append(f"it assigns `.data` of {written}{f' at {where}' if where else ''}, a "
                           f"new tensor the graph does not carry back (write into it in place "
                           f"under torch.no_grad() instead: `w.copy_(torch.renorm(w, 2, 0, max_norm))`)")
        elif where is not None and not _same_tensor_data(tensor, value):
            # An intermediate's (`g.data = h.detach() * 3`): eager's `g` takes the new values
            # and keeps its gradient's path; the trace kept neither, and the loss trained 0.44
            # off eager's, silently (hunt82).
            effects.append(f"it assigns `.data` of a tensor it computes at {where}, which the trace "
                           f"does not keep (compute with the new values under torch.no_grad() in "
                           f"place instead, `g.copy_(...)`, or use the new tensor itself)")
        descriptor.__set__(tensor, value)

    torch.Tensor.data = property(get, assign, doc=descriptor.__doc__)
    try:
        yield
    finally:
        if own is None:
            del torch.Tensor.data
        else:
            torch.Tensor.data = own


def _same_tensor_data(tensor, value) -> bool:
    """Whether assigning `value` as `tensor.data` changes nothing: the same memory in the
    same layout (`w.data = w.data.contiguous()` of a contiguous weight; refusing it was a
    review's finding)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    try:
        return (isinstance(value, torch.Tensor) and value.dtype == tensor.dtype and value.shape == tensor.shape
                and value.stride() == tensor.stride() and value.storage_offset() == tensor.storage_offset()
                and StorageWeakRef(value.untyped_storage()) == StorageWeakRef(tensor.untyped_storage()))
    except (RuntimeError, NotImplementedError):   # a tensor without storage
        return False


def _drawing_functions() -> list[tuple[object, str, object, str]]:
    """(module, name, function, 'python' or 'numpy') of the functions that draw from
    Python's and NumPy's global generators (`random.random`, `np.random.rand`: methods of
    the one generator instance each module keeps)."""
    found = [(random, name, getattr(random, name), "python") for name in dir(random)
             if getattr(getattr(random, name), "__self__", None) is random._inst
             and name not in ("getstate", "setstate", "seed")]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state = numpy.random.mtrand._rand
        found += [(numpy.random, name, getattr(numpy.random, name), "numpy") for name in dir(numpy.random)
                  if getattr(getattr(numpy.random, name), "__self__", None) is state
                  and name not in ("get_state", "set_state", "seed")]
    return found


#: Said of a draw from Python's or NumPy's global generator that moved it, where the
#: forward left it in the state it found: the forward set the state (a seed, a state put
#: back) by a way the tracing hooks do not watch (`np.random.mtrand.set_state`, `from
#: numpy.random import seed`), as a first call left it (hunt79 F5: a noise drawn then its
#: state put back was a constant of the graph, 4.7 off eager's loss).
_STATE_SET_FIRST = (", found in the state it was in before the call: the forward sets that state (a seed, "
                    "a state put back), and the step, which runs no Python, would not set it or draw")


#: Where a draw from NumPy's global generator comes from in transformers, and what to do.
_LIBRARY_DRAWS = {
    "_compute_mask_indices": "transformers' SpecAugment: set mask_time_prob=0.0 and "
                             "mask_feature_prob=0.0 in the model's config",
}


def _noting_draw(function, name: str, generator: str, draws: dict[str, str], ranged: list[int] | None):
    """`function`, noting in `draws[generator]` where the model's code first calls it: the
    line of the draw, which comparing the generator's state afterwards cannot name
    (transformers' speech models draw their SpecAugment masks with NumPy; the error said
    "np.random" and no more). With `ranged` (one count per forward traced), Python's
    `random()` and `uniform()` called by the model's code return a `RangedDraw`, counted
    in `ranged[-1]` (`python_draws`)."""
    short = name.rsplit(".", 1)[-1]

    def call(*args, **kwargs):
        frame = sys._getframe(1)
        in_model = is_model_file(frame.f_code.co_filename)
        noting = generator not in draws and in_model
        before = PythonGenerators() if noting else None
        value = function(*args, **kwargs)
        # A call that moves the generator: one drawing nothing (`random.sample(pop, 0)`)
        # is no draw (hunt79 F0).
        if noting and _GENERATOR_NAMES[generator] in before.moved():
            function_name = frame.f_code.co_name
            hint = _LIBRARY_DRAWS.get(function_name)
            draws[generator] = (f"{name} at {frame.f_code.co_filename}:{frame.f_lineno} in "
                                f"{function_name}{f'; {hint}' if hint else ''}")
        if ranged is not None and ranged and generator == "python" and in_model and short in RANGES:
            ranged[-1] += 1
            low, high = RANGES[short](*args, **kwargs)
            return RangedDraw(low, high, f"{name} at {frame.f_code.co_filename}:{frame.f_lineno} in "
                                         f"{frame.f_code.co_name}")
        return value
    return call


#: `PythonGenerators.moved()`'s name of each global generator `_noting_draw` watches.
_GENERATOR_NAMES = {"python": "Python's", "numpy": "NumPy's"}


#: An attribute the module did not have.
MISSING = object()
#: What a tensor assigned where there was none (a cache) is said with.
_FIRST_CALL = (" where it held no tensor (a cache its first call fills? Run the model once "
               "before remat: lowering then holds what it cached as a constant, compared "
               "before every call)")


#: Said of a tensor needing a gradient assigned to a module where the same call set the
#: attribute to a plain value first (RecurrentGemma's recurrent state, reset to None in
#: training; a router's auxiliary loss): hunt64, the advice to run the model once first
#: could not help. Stored detached, the loss reading it afterwards lost its gradient
#: (hunt67: 3.78 off), so it stays refused, saying why.
_RESET_STATE = (" after setting it to a plain value earlier in the call, a tensor needing a gradient: a state "
                "kept for generation, or an auxiliary loss the caller reads after the call? remat-ir stores on "
                "modules only tensors needing no gradient, and cannot tell whether the loss differentiates "
                "through it: return an auxiliary loss from the forward, or store a state no loss reads "
                "detached (`.detach()`), which then trains like eager")


#: Said of a tensor needing a gradient that the forward assigns to a module: a feature
#: the loss reads (a center loss; hunt59: the way out came last, after advice on caches
#: and weights), or AWD-LSTM's weight drop (found by a review, the advice was for
#: counters and logs).
_COMPUTED_WEIGHT = (", a tensor needing a gradient: a feature the loss reads (a center loss, a "
                    "regularizer)? Return it from the forward instead (`return out, feature`); a weight "
                    "computed in the forward (a weight drop?): register that computation as a "
                    "parametrization, `torch.nn.utils.parametrize.register_parametrization`; both train "
                    "like eager")


def _ranged_draws_alone(before: tuple, ranged: list[int] | None) -> bool:
    """Whether the `RangedDraw`s counted in `ranged` (per forward traced) are all that
    moved Python's generator from state `before`, as many in every forward: drawn again
    from `before`, that many `random()` calls reach the state it is in now."""
    if not ranged or len(set(ranged)) != 1:
        return False
    after = random.getstate()
    random.setstate(before)
    for _ in range(sum(ranged)):
        random.random()
    same = random.getstate() == after
    random.setstate(after)
    return same


def _generators(model: torch.nn.Module) -> list[tuple[str, object, object]]:
    """(where, generator, its state) of the random generators the model's modules and the
    plain objects they hold keep as attributes (`self.rng = np.random.default_rng(0)`,
    `random.Random(0)`, `np.random.RandomState(0)`): their own generators, not the global
    ones `_drawing_functions` watches."""
    numpy = sys.modules.get("numpy")
    found = []
    for path, module in model.named_modules():
        holders = [(path, vars(module))] + [(f"{path}.{name}" if path else name, vars(helper))
                                            for name, helper in held_objects(module)]
        for where, attributes in holders:
            for name, value in list(attributes.items()):
                state = generator_state(value, numpy)
                if state is not None:
                    found.append((f"{where}.{name}" if where else name, value, state))
    return found


def _hook_holders(hook, depth: int = 0) -> list[tuple[str, object]]:
    """(name, object) of what a hook can store into besides the modules: the cells of its
    closure, its defaults, the globals its code names, a bound method's object, a
    partial's arguments, a callable object's attributes (`SaveOutput()`, the tutorials'
    feature extractor), and so for the user's functions among those, 3 deep (a hook
    calling `save(name, out)`, whose closure holds the store). Those two kept tracing's
    placeholder, unrefused: the loss reading it was a FakeTensor, whose backward "ran" and
    whose gradients AdamW applied, then the next step failed inside torch (found by a
    review)."""
    if depth > 2:
        return []
    if isinstance(hook, functools.partial):
        return [("an argument of its partial", value) for value in (*hook.args, *hook.keywords.values())] \
            + _hook_holders(hook.func, depth)
    if isinstance(hook, types.MethodType):
        return [(f"its {type(hook.__self__).__name__} object", hook.__self__)] + _hook_holders(hook.__func__, depth)
    code = getattr(hook, "__code__", None)
    if code is None:
        call = _call_of(hook)
        return ([(f"its {type(hook).__name__} object", dict(vars(hook)))] + _hook_holders(call, depth)
                if call is not None else [])
    cells = zip(code.co_freevars, hook.__closure__ or ())
    found = [(f"{name!r} of its closure", cell.cell_contents) for name, cell in cells
             if cell.cell_contents is not None] if hook.__closure__ else []
    found += [("a default argument", value) for value in hook.__defaults__ or ()]
    found += [(f"global {name!r}", hook.__globals__[name]) for name in code.co_names if name in hook.__globals__]
    for _, value in list(found):
        try:
            inner = getattr(underlying(value), "__code__", None)
        except Exception:   # a `__getattr__` raising another error than AttributeError
            continue
        if inner is not None and inner is not code and is_users_file(inner.co_filename):
            found += _hook_holders(value, depth + 1)
    return found


def _call_of(hook) -> types.FunctionType | None:
    """The `__call__` of a callable object's class, where the user's code defines it."""
    call = getattr(type(hook), "__call__", None)
    if isinstance(hook, type) or not isinstance(call, types.FunctionType):
        return None
    return call if is_users_file(call.__code__.co_filename) else None


def _placeholders_kept_by_hooks(model: torch.nn.Module, found: list[str]) -> None:
    """Note each forward hook that stored a tensor where the graph keeps no trace of it: a
    dict its closure holds (a feature-matching or perceptual loss collecting activations).
    The dict kept tracing's placeholder, no later step filled it, and the loss failed
    inside torch or found nothing (found by a review)."""
    for path, hook in forward_hooks(model):
        code = getattr(underlying(hook), "__code__", None) or getattr(_call_of(hook), "__code__", None)
        if code is None:
            continue
        # A library's hook too: torch.ao's `ActivationSparsifier` aggregating a layer's
        # inputs kept tracing's placeholder and trained on silently, its statistics never
        # filled (found by hunt56). (transformers' hooks capturing hidden states hand
        # theirs to the forward's outputs, and keep none.)
        instead = ("return what the loss needs from the forward instead" if is_users_file(code.co_filename)
                   else "it is a library's: remove it before remat_ir.remat, or train this model without remat")
        for name, holder in _hook_holders(hook):
            if holds_placeholder(holder):
                where = f" at {code.co_filename}:{code.co_firstlineno}"
                found.append(f"a forward hook on {path}{where} keeps a tensor in {name}, "
                             f"which the graph does not fill ({instead})")
                break


def _holds_tensor(value) -> bool:
    if isinstance(value, dict):
        value = list(value.values())
    return isinstance(value, torch.Tensor) or (
        isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value))


def _put_back_helpers(helpers: list, found: list[str]) -> None:
    """Tensors the traced forward left on plain objects its modules hold (a helper's cache)
    taken off again: they are tracing placeholders, with which an eager call of the model
    (evaluation runs it as it is) computed otherwise than eager, silently (diffusers'
    Z-Image, whose `RopeEmbedder` caches its rotary tables at its first call: 1.3088
    where eager gives 1.3472). A cache filled where there
    was none is what the graph computes at every step; one replaced (state a call updates)
    is an effect the graph would not keep."""
    for where, helper, before, users, containers in helpers:
        now = vars(helper)
        for key, value in list(now.items()):
            then = before.get(key, MISSING)
            if users and plain(then) and plain(value) and not (type(value) is type(then) and value == then):
                # A counter on an object the user's module holds (`self.state.step += 1`).
                found.append(f"it changes attribute {key!r} of the {type(helper).__name__} object at "
                             f"{where} (from {then!r} to {value!r})")
                now[key] = then
            elif users and key in containers and value is then and not _same_items(value, containers[key]) \
                    and not _holds_tensor(value):   # tensors kept there are `outside_state`'s to name
                # A list or dict of it changed in place (`self.log.items.append(...)`, a
                # count in `self.state.d`: hunt60, the step kept tracing's, silently).
                found.append(f"it changes the {type(value).__name__} in attribute {key!r} of the "
                             f"{type(helper).__name__} object at {where}")
                _put_back_items(value, containers[key])
        for key in [k for k, value in now.items() if value is not before.get(k, MISSING) and _holds_tensor(value)]:
            if before.get(key) is not None:
                found.append(f"it assigns tensors to attribute {key!r} of the "
                             f"{type(helper).__name__} object at {where}")
            if key in before:
                now[key] = before[key]
            else:
                del now[key]


def _rnn_weights_hint(model: torch.nn.Module, paths: list[str]) -> str:
    """The way out for a recurrent module's weight assigned at each call (`paths`, as
    torch.export names them: 'self.lstm.weight_hh_l0'), as AWD-LSTM's and fastai's weight
    dropout do (found by hunt58: the generic advice did not apply); '' for others."""
    modules = dict(model.named_modules())
    for path in paths:
        *owner, name = path.split(".")[1:]
        module = modules.get(".".join(owner))
        if isinstance(module, torch.nn.RNNBase) and name in module._flat_weights_names:
            return (f" (a recurrent module's weight, assigned at each call as a weight dropout does: "
                    f"pass it to the module instead, `torch.func.functional_call(self.{'.'.join(owner)}, "
                    f"{{{name!r}: weight}}, (x,))`, which remat-ir trains as eager does)")
    return ""


def _containers_copied(helper) -> dict:
    """Shallow copies of the lists and dicts a helper object holds, by attribute."""
    return {key: copy.copy(value) for key, value in vars(helper).items() if type(value) in (list, dict)}


def _same_items(container, copied) -> bool:
    """Whether a list or dict holds the very items its copy does."""
    if len(container) != len(copied):
        return False
    if isinstance(container, dict):
        return all(key in copied and value is copied[key] for key, value in container.items())
    return all(a is b for a, b in zip(container, copied))


def _put_back_items(container, copied) -> None:
    if isinstance(container, dict):
        container.clear()
        container.update(copied)
    else:
        container[:] = copied


def _held(module: torch.nn.Module, key: str):
    """What `module.key` holds now (a submodule, parameter, buffer or plain attribute),
    read without `__getattr__`; `MISSING` where nothing."""
    own = vars(module)
    for table in ("_modules", "_parameters", "_buffers"):
        if key in own.get(table, {}):
            return own[table][key]
    return own.get(key, MISSING)


def _assigning_frame(key: str):
    """The frame of the code assigning `key`, called from `setattr_noted`: its caller,
    past remat-ir's own `passing` wrappers (`added_members` notes where members are made);
    for `training`, the first frame above `Module.train` (`self.teacher.eval()` in a
    forward: hunt77 F1, a teacher put in evaluation mode at every call stayed in training
    mode after the caller's `model.train()`, its statistics and outputs 0.65 off eager's)."""
    frame = past_passing(sys._getframe(2))
    if key == "training":
        while frame is not None and frame.f_code.co_filename == _MODULE_FILE \
                and frame.f_code.co_name in ("train", "eval"):
            frame = past_passing(frame.f_back)
    return frame


#: remat-ir's own packages beside the frontends, whose code puts the generators back
#: while a forward is traced (`torchlib.generators`: a custom Function's trial run).
_OWN_PACKAGES = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), part) + os.sep
                      for part in ("torchlib", "runtimes", "ir", "solvers", "remat_ir"))

#: `torch.nn.Module`'s file, where `train` and `eval` set `training`.
_MODULE_FILE = torch.nn.modules.module.__file__


@contextlib.contextmanager
def refusing_trace_effects(model: torch.nn.Module, found: list[str], assigned: dict | None = None,
                           python_draws: list[int] | None = None, stored: StoredTensors | None = None,
                           settled: dict | None = None):
    """While the block traces `model`, note in `found` each effect the graph would not keep
    (module docstring); module attributes are put back afterwards. With `assigned`, a plain
    value the model's code assigns to one of its modules' attributes is not an effect
    where it is the value the attribute had (it goes into `settled`, (module path,
    attribute) -> value, which the runtime assigns after each call); otherwise it goes into `assigned`, as
    (module path, attribute) -> (value, 'file:line', the value before or `MISSING`), for
    the caller to trace again. With `python_draws`, numbers the model's code draws from
    Python's generator with `random()` and `uniform()` are `RangedDraw`s (`python_draws`
    module): where they are all its draws, as many in each forward traced, that count is
    appended to `python_draws` instead of an effect noted. With `stored`, a tensor needing no
    gradient that the model's code assigns to a public attribute of one of its modules is
    noted there (`stored_tensors`), and the traced forward returns it after its outputs."""
    python, outside_generators, generator = random.getstate(), PythonGenerators(), torch.get_rng_state()
    seed = torch.default_generator.initial_seed()
    attributes = _attribute_state(model)
    # The user's: held by a module of the user's, or of a class of the user's (a subclass
    # of accelerate's `ModelHook` that `add_hook_to_module` puts on a layer, counting its
    # calls: the count stayed at tracing's, silently; hunt57).
    helpers = [(f"{path}.{name}" if path else name, helper, dict(vars(helper)),
                in_users_file(type(module).__module__) or users_class(type(helper)), _containers_copied(helper))
               for path, module in model.named_modules() for name, helper in held_objects(module)]
    generators = _generators(model)
    outside, caches = outside_state.holders(model), outside_state.lru_caches(model)
    paths = ModulesByDict(model)   # a proxy for a module at two paths sets its dict
    originals = [(owner, name, getattr(owner, name), "torch") for owner, name in _TORCH_RNG]
    # Python's and NumPy's generators set by the forward, drawn from or not (hunt79: a
    # forward seeding them, lowered after one call, found them where it leaves them, and
    # the step never set them: the caller's later draws were other than eager's).
    numpy = sys.modules.get("numpy")
    originals += [(owner, name, getattr(owner, name), owner.__name__) for owner, name in
                  [(random, "seed"), (random, "setstate"),
                   *([(numpy.random, "seed"), (numpy.random, "set_state")] if numpy is not None else [])]]

    def noted(prefix, name, function):
        def call(*args, **kwargs):
            if (where := model_caller(1)) and prefix != "torch" and where.startswith(_OWN_PACKAGES):
                # remat-ir putting the generator back after running the model's code once (a
                # custom op's trial run): the draws before are undone, no state the forward set.
                draws.pop("python" if prefix == "random" else "numpy", None)
            elif where:
                found.append(f"it calls {prefix}.{name} at {where}" + (
                    "" if prefix == "torch" else " (the step, which runs no Python, would not set the generator)"))
            return function(*args, **kwargs)
        return call

    for owner, name, function, prefix in originals:
        setattr(owner, name, noted(prefix, name, function))
    draws: dict[str, str] = {}   # generator -> where the model's code first drew from it
    ranged: list[int] | None = [] if python_draws is not None else None   # per forward traced
    drawing = _drawing_functions()
    for owner, name, function, source in drawing:
        setattr(owner, name, _noting_draw(function, f"{owner.__name__}.{name}", source, draws, ranged))
    # torch.export puts back the attributes a forward assigned, so assignments are noted
    # as they happen; in-place changes to lists and dicts are found by comparing after.
    module_setattr = torch.nn.Module.__setattr__
    plainly_set: set[tuple[int, str]] = set()   # (module, attribute) given a plain value: `_RESET_STATE`

    through_setattr: set[tuple[int, str]] = set()   # (module, attribute) assigned through `__setattr__`

    def setattr_noted(module, key, value):
        through_setattr.add((id(module), key))
        if isinstance(inspect.getattr_static(type(module), key, None), property):
            # A property's setter: what it writes is noted as it writes it (its `del` on
            # putting back crashed, hunt77 F16).
            return module_setattr(module, key, value)
        # Read from the instance: a module whose __init__ assigns before Module.__init__ has
        # none yet, and `module._buffers` went to its __getattr__, which raised (named as the
        # model's own AttributeError, "eager raises it too").
        buffers = vars(module).get("_buffers", {})
        if key in buffers and buffers[key] is value:
            # `self.count += 1` on a buffer adds in place, then assigns the same tensor back.
            # The add is traced as the buffer's update; the assignment changes nothing, and
            # passed on, torch.export adds a copy of the buffer onto itself after the ops
            # that read it (AOTAutograd then refused a backward reading it: "modified by an
            # inplace operation").
            return
        if plain(value):   # a reset (`self.state = None`), held already or not
            plainly_set.add((id(module), key))
        frame = _assigning_frame(key)
        caller = frame.f_code.co_filename
        # A module outside the model (one the forward makes and drops) keeps nothing of it.
        path = paths.of(module)[0]
        models = (key not in _MODULE_KEYS or key == "training") and path is not None and (
            is_users_file(caller) if key.startswith("_") else is_model_file(caller))
        if _held(module, key) is value:
            # The object it holds already (`self.classifier = self.classifier.to(dtype)`,
            # the cast changing nothing: `module_casts`): no effect, but a plain one is
            # assigned again after each call (`settled`).
            if models and settled is not None and plain(value):
                settled[(path, key)] = value
            return module_setattr(module, key, value)
        if models:
            where = f"{caller}:{frame.f_lineno}"
            if assigned is not None and plain(value):
                at = (path, key)
                before = assigned[at][2] if at in assigned else vars(module).get(key, MISSING)
                assigned[at] = (value, where, before)
            elif stored is not None and not key.startswith("_") and key not in buffers and \
                    stored.note(path, key, value, where):
                pass   # returned by the graph, stored by the runtime (`stored_tensors`)
            elif key in buffers:
                found.append(f"it assigns a new tensor to buffer {key!r} of {type(module).__name__} "
                             f"at {where} (write into the buffer in place instead, "
                             f"`self.{key}.copy_(...)`, which the graph keeps)")
            else:
                computed = isinstance(value, torch.Tensor) and value.requires_grad
                reset = computed and (id(module), key) in plainly_set
                first = (_holds_tensor(value) and vars(module).get(key) is None
                         and key not in vars(type(module)) and not reset)
                found.append(f"it assigns module attribute {key!r} of {type(module).__name__} "
                             f"at {where}" + (_FIRST_CALL if first else "")
                             + (_RESET_STATE if reset else _COMPUTED_WEIGHT if computed else ""))
        module_setattr(module, key, value)

    torch.nn.Module.__setattr__ = setattr_noted
    register_buffer = torch.nn.Module.register_buffer
    # The real buffers, by module dictionary and name: tracing reads stand-ins, and a buffer
    # registered again with the tensor it holds (LongRoPE's `original_inv_freq`, a plain
    # attribute holding the buffer) changes nothing (found by a review: refused).
    buffers_before = {(id(vars(m)), name): b for m in model.modules()
                      for name, b in vars(m).get("_buffers", {}).items()}

    def register_noted(module, name, tensor, persistent=True):
        # A buffer the forward registers: one not yet there became a tracing placeholder on the
        # model, and AOTAutograd then failed deep inside ("modified by an inplace operation").
        where = model_caller(1)
        held = vars(module).get("_buffers", {}).get(name)
        if where and held is None:   # absent, or None
            found.append(f"it registers buffer {name!r} of {type(module).__name__} at {where} "
                         f"(register it in __init__, and write into it in place in the forward: "
                         f"`self.{name}.copy_(...)`)")
        elif where and tensor is not held and tensor is not buffers_before.get((id(vars(module)), name)) \
                and paths.of(module)[0]:
            # Registered again with a new tensor (transformers' dynamic rotary embedding
            # past its cached length): the graph computes with the new one, and torch.export
            # carries it back to the root's buffers only; a submodule kept the old one, and
            # later steps and evaluations computed with it, silently (found by a review:
            # gradients 5.8 off eager's).
            found.append(f"it registers buffer {name!r} of {type(module).__name__} again at {where}, a "
                         f"new tensor in its place, which the graph does not carry back (write into "
                         f"it in place instead: `self.{name}.copy_(...)`)")
        elif where and tensor is not held and isinstance(tensor, torch.Tensor) and (
                tensor.shape != held.shape or tensor.dtype != held.dtype):
            # The root's, of another shape (an older transformers rotary cache grown for a
            # longer batch): export carries a new value back into the buffer it holds, of
            # the old shape, and AOTAutograd failed ("expand 12 -> 8"), the refusal
            # blaming eager's forward, which grows it (hunt80 F1).
            found.append(f"it registers buffer {name!r} of {type(module).__name__} again at {where}, a "
                         f"{tuple(tensor.shape)} {tensor.dtype} tensor in place of its {tuple(held.shape)} "
                         f"{held.dtype} one, which no step can hold: call the model once with the "
                         f"longest inputs before remat-ir lowers it (a cache grown with the length then "
                         f"holds every length), or keep the table as a plain tensor attribute")
        return register_buffer(module, name, tensor, persistent)

    torch.nn.Module.register_buffer = register_noted

    def compare(module, inputs, output):
        """At the end of the traced forward, before torch.export puts attributes back
        (a list appended to is restored as a copy of its old items)."""
        modules = dict(model.named_modules())
        for (path, key), before in attributes.items():
            if path in modules and key in vars(modules[path]) and _changed(
                    before, vars(modules[path])[key], tensors=not key.startswith("_"), derived=is_derived):
                found.append(_change_said(key, path, before))
            elif path in modules and _replaced_unseen(modules[path], key, before[0], through_setattr):
                found.append(f"it changes module attribute {key!r} of {path or '<root>'} without "
                             f"`nn.Module.__setattr__` (`object.__setattr__`, `self.__dict__[...]`, "
                             f"`vars(self)`, a property's setter), which tracing runs once and the graph "
                             f"does not keep: keep it outside the forward, or, for a bool, number, "
                             f"string or None, assign it as `self.{key} = ...` (remat-ir then assigns "
                             f"what every call assigns, and refuses a counter by line)")
                object.__setattr__(modules[path], key, before[0])

    # What a private cache may not hold, followed only where the model's own classes keep
    # private containers: the mode costs every traced op a Python call (a 2-layer GPT-2,
    # which keeps none, lowered about a fifth slower with it).
    derived = CallDerived() if any(key.startswith("_") for _, key in attributes) else None
    marking = model.register_forward_pre_hook(
        lambda module, args, kwargs: derived.mark(call_sources(model, (args, kwargs))),
        with_kwargs=True) if derived is not None else None
    is_derived = derived.derived if derived is not None else None
    handle = model.register_forward_hook(compare)
    returning = stored.hook(model) if stored is not None else None
    starts = model.register_forward_pre_hook(lambda module, inputs: ranged.append(0)) if ranged is not None else None
    reparametrized = hook_reparametrizations(model)   # assigned by hooks whose weights the graph computes
    uses: list[tuple[str, int, str]] = []
    try:
        # The cached functions' context outermost: what it runs after the trace (`_stale`)
        # runs with the other contexts gone.
        with warnings.catch_warnings(record=True) as said, cached_functions_traced(model, found), \
                _noting_data_uses(uses, model, found), \
                noting_autograd_state(found), noting_backend_flags(found), tracing_own_sdpa_kernels(found), \
                noting_argument_writes(model, found), noting_hook_registrations(model, found), \
                derived if derived is not None else contextlib.nullcontext(), fresh_generators_noted() as fresh:
            warnings.simplefilter("always")
            yield
    except Exception as exc:
        if uses:   # export runs the forward more than once: each place once
            setattr(exc, _DATA_USES, list(dict.fromkeys(uses)))
        raise
    finally:
        handle.remove()
        if marking is not None:
            marking.remove()
        if returning is not None:
            returning.remove()
        if starts is not None:
            starts.remove()
        torch.nn.Module.__setattr__ = module_setattr
        torch.nn.Module.register_buffer = register_buffer
        for owner, name, function, _ in originals:
            setattr(owner, name, function)
        for owner, name, function, _ in drawing:
            setattr(owner, name, function)
        for warning in said:
            # torch.export's own finding: a tensor assigned into a module's attributes
            # (appended to a list of them too), which it puts back and warns about.
            tensors = re.match(r"The tensor attributes? (.*) (?:was|were) assigned during export",
                               str(warning.message))
            if tensors:
                # Private attributes are torch's (an RNN refreshes its `_flat_weights`); the
                # user's own are noted as they are assigned or appended to.
                kept = stored.named() if stored is not None else set()
                public = [path for path in tensors.group(1).split(", ")
                          if not any(part.startswith("_") for part in path.split(".")[1:])
                          and path.split(".", 1)[-1] not in reparametrized
                          and path.split(".", 1)[-1] not in kept]
                if public:
                    found.append(f"it assigns tensors to {', '.join(public)}" + _rnn_weights_hint(model, public))
            else:
                warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                       warning.lineno)
        if not torch.equal(torch.get_rng_state(), generator):
            # Set by a call noted above or a new seed (`torch.default_generator.manual_seed(0)`:
            # hunt62), else moved by a draw tracing ran for real: one read as a number (mixup's
            # `Beta(a, a).sample().item()`: said as a state set before, hunt61).
            said = any(effect.startswith("it calls torch.") for effect in found) or \
                torch.default_generator.initial_seed() != seed
            found.append("it sets torch's generator state" if said else _DRAWN_FOR_REAL)
            torch.default_generator.manual_seed(seed)   # its seed, then its state, as they were
            torch.set_rng_state(generator)
        if random.getstate() != python:
            if _ranged_draws_alone(python, ranged):
                python_draws.append(ranged[0])
            else:
                found.append(f"it draws from Python's random generator "
                             f"({draws.get('python', 'random.random and the like')})")
            random.setstate(python)
        elif "python" in draws:
            found.append(f"it draws from Python's random generator ({draws['python']}){_STATE_SET_FIRST}")
        if "NumPy's" in outside_generators.moved():
            found.append(f"it draws from NumPy's random generator ({draws.get('numpy', 'np.random')})")
            outside_generators.restore()
        elif "numpy" in draws:
            found.append(f"it draws from NumPy's random generator ({draws['numpy']}){_STATE_SET_FIRST}")
        modules = dict(model.named_modules())
        added = {(path, key) for path, module in modules.items() for key in vars(module)
                 if not key.startswith("_") and key not in _MODULE_KEYS
                 and (path, key) not in attributes}
        for path, key in sorted(added):
            if (path, key) not in (assigned or {}) and (stored is None or (path, key) not in stored.places):
                found.append(f"it assigns module attribute {key!r} of {path or '<root>'}")
            delattr(modules[path], key)
        for at, (value, _, before) in list((assigned or {}).items()):
            if type(before) is type(value) and before == value:
                del assigned[at]   # the value it had: nothing to keep now
                if settled is not None:
                    settled[at] = value
        for (path, key), before in attributes.items():
            module = modules.get(path)
            if module is not None and _changed(before, vars(module).get(key), tensors=not key.startswith("_"),
                                               derived=is_derived):
                found.append(_change_said(key, path, before))
                _restore(module, key, before)
        _put_back_helpers(helpers, found)
        if fresh:   # it moves no generator the model holds nor a global one
            found.append(f"it makes a random generator without a seed ({fresh[0]}), whose numbers the "
                         f"graph would hold as constants")
        numpy_module = sys.modules.get("numpy")
        for where, generator, state in generators:
            if not same_state(generator_state(generator, numpy_module), state):
                found.append(f"it draws from the {type(generator).__name__} at {where!r}, an "
                             f"{'iterator' if iterator_state(state) else 'own generator'} of the model's")
                restore_generator(generator, state)
        _placeholders_kept_by_hooks(model, found)   # before their stores are put back
        outside_state.placeholders_left(outside, found)
        outside_state.clear_grown(caches)
