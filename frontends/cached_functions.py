"""The user's `functools.lru_cache`d functions, watched while a forward is traced.

A forward may take a table from a cached function (`causal_mask(n)`, a rotary table per
length). A miss while traced puts the function's ops into the graph, which computes the
table at every step: right for a constant table, but one drawn at random
(`torch.randn(n, d)` cached per length) or computed from the trained weights is
computed once by eager and read back, where the graph computed it again at every step:
other numbers from the second step, silently.

While traced, each such function (in the user's globals, closures and classes, and the
model's classes: `outside_state.namespaces`) is called through its cache as before, under
`CallDerived`, which follows what it computes from random draws and the trained
parameters. A miss whose result holds such a value (through lists, tuples, dicts, a
module's parameters and buffers, an object's attributes) is refused by line. A hit on
a placeholder this trace cached is what it was; one on real tensors an eager call
cached before lowering (a real tensor would be refused as one nothing holds: hunt80
F6, whether a model trained depended on whether an evaluation ran first) is traced
from the body instead, and after the trace the body, run for real, must give the
cached tensors (it does not where a buffer it read changed since). A forward writing
in place into a tensor a cached function returned is refused too: eager's cache holds
the edit. A function with `maxsize=0` caches nothing: eager computes at every call, as
the graph does. Not caught: a buffer the function read changing after lowering (eager
keeps the first table).

Running every call uncached instead (2026-12-07, reverted the same day) changed what
eager's cache means: a table the forward then edits in place, compounding in eager, a
warm cache eager never draws past, a function of a fresh tensor argument (hunt85
F0, F3, F4), and `cache_info()` called by the forward (F9).
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch._subclasses.fake_tensor import is_fake

from . import outside_state
from .constant_tensors import CallDerived, tensors_in
from .held_tensors import held_objects
from .model_lines import in_users_file, model_caller


def _cached_function(value):
    """The `lru_cache` wrapper `value` is, or wraps as a static or class method or as a
    property's getter, else None."""
    inner = value.__func__ if isinstance(value, (staticmethod, classmethod)) else \
        value.fget if isinstance(value, property) else value
    if isinstance(inner, functools._lru_cache_wrapper) and callable(getattr(inner, "__wrapped__", None)):
        return inner
    return None


def _rewrapped(value, replacement):
    """`replacement` in `value`'s place: as a static or class method, or a property's getter."""
    if isinstance(value, (staticmethod, classmethod)):
        return type(value)(replacement)
    if isinstance(value, property):
        return property(replacement, value.fset, value.fdel, value.__doc__)
    return replacement


def _places(model: torch.nn.Module) -> list[dict]:
    """Where the user's cached functions may be held: the user's globals, closures and
    classes, the model's classes (`outside_state.namespaces`), and, which those miss (a
    review, hunt85 F5), each module's own attributes (`self.noise = lru_cache(...)`) and
    the classes of the helper objects modules hold (a class made inside a function)."""
    places = [names for _, names in outside_state.namespaces(model)]
    classes = {}
    for module in model.modules():
        places.append(vars(module))   # written past `nn.Module.__setattr__`, as it holds them
        for _, helper in held_objects(module):
            classes.setdefault(id(type(helper)), type(helper))
    return places + [outside_state.ClassAttributes(cls) for cls in classes.values() if in_users_file(cls.__module__)]


def _watched(cached, model: torch.nn.Module, found: list[str], running: list, returned: list, warm: list):
    """`cached`, called through its cache under `CallDerived`; a miss computing from
    draws or trained weights noted in `found`. A hit on real tensors an eager call cached
    is traced from the body instead, noted in `warm` to compare after the trace. The
    tensors each call returns go into `returned` with their versions, to find the
    forward writing into one. A call within another (a memoized recursion) is not watched
    again. Its cache's methods stay reachable."""
    function = cached.__wrapped__

    def traced(through, args, kwargs):
        derived = CallDerived()
        derived.mark([p for p in model.parameters() if p.requires_grad])
        running.append(function)
        try:
            with derived:
                return through(*args, **kwargs), derived
        finally:
            running.pop()

    @functools.wraps(function)
    def call(*args, **kwargs):
        if running:
            return cached(*args, **kwargs)
        misses = cached.cache_info().misses
        result, derived = traced(cached, args, kwargs)
        where = model_caller(1) or "the forward"
        computed, kept = cached.cache_info().misses > misses, None
        if not computed and any(not is_fake(t) for t in _held_tensors(result)):
            kept, computed = result, True
            result, derived = traced(function, args, kwargs)
        returned.extend((function.__qualname__, where, tensor, tensor._version) for tensor in _held_tensors(result))
        if computed and any(derived.derived(t) for t in _held_tensors(result)):
            found.append(f"it takes a tensor from {function.__qualname__}, a `functools.lru_cache`d "
                         f"function, at {where}, which computes it from random draws or the trained "
                         f"weights: eager computes it once and reads it back from the cache, the graph "
                         f"would compute it again at every step. Compute it in the forward without the "
                         f"cache, or once outside it (a buffer made in `__init__`)")
        elif kept is not None:
            warm.append((function, args, kwargs, kept, where, _autocasts()))
        return result

    for name in ("cache_info", "cache_clear", "cache_parameters"):
        setattr(call, name, getattr(cached, name))
    return call


def _autocasts() -> list[tuple[str, torch.dtype]]:
    """(device type, dtype) of each autocast on where the forward calls a function."""
    return [(device, torch.get_autocast_dtype(device)) for device in ("cpu", "cuda")
            if torch.is_autocast_enabled(device)]


def _stale(warm: list) -> list[str]:
    """The refusals for tables an eager call cached before lowering (the trace computed
    them from the body: hunt80 F6, where a warm cache was refused as a tensor nothing
    holds) that differ from what the body computes now, run for real after the trace:
    eager reads the cached table, the graph would compute the other one. Once a function."""
    refused = {}
    for function, args, kwargs, kept, where, autocasts in warm:
        if function.__qualname__ in refused:
            continue
        generator = torch.get_rng_state()
        try:
            with torch.no_grad(), contextlib.ExitStack() as stack:
                for device, dtype in autocasts:   # as the forward called it (hunt87 F2)
                    stack.enter_context(torch.autocast(device, dtype=dtype))
                now = _held_tensors(function(*args, **kwargs))
        finally:
            torch.set_rng_state(generator)
        kept = _held_tensors(kept)
        if len(now) != len(kept) or not all(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
                                            for a, b in zip(now, kept)):
            refused[function.__qualname__] = (
                f"it takes a tensor at {where} from the cache of {function.__qualname__}, a "
                f"`functools.lru_cache`d function, that an earlier call filled with other values "
                f"than it computes now: eager reads the cached tensor, the graph would compute it "
                f"afresh at every step. Call `{function.__qualname__}.cache_clear()` before "
                f"remat_ir.remat, or compute it without the cache")
    return list(refused.values())


def _held_tensors(value, depth: int = 0) -> list[torch.Tensor]:
    """The tensors `value` holds: through lists, tuples and dicts, a module's parameters
    and buffers, a plain object's attributes, 3 deep (a cached factory of a module or a
    dataclass of random tensors: hunt85 F0b)."""
    if isinstance(value, torch.nn.Module):
        return [*value.parameters(), *value.buffers()]
    found = tensors_in(value, [])
    if depth < 3 and not found and hasattr(value, "__dict__") and not isinstance(value, type):
        for item in vars(value).values():
            found += _held_tensors(item, depth + 1)
    return found


def _written(returned: list) -> list[str]:
    """The refusals for tensors a cached function returned that the forward then wrote
    into in place (their version moved): eager's cache holds the edited tensor, so each
    call starts from what the last left (a table doubled at every step), where the graph
    computes it afresh (hunt85 F0, silent with a cache empty at lowering). Once a function."""
    refused = {}
    for name, where, tensor, version in returned:
        if tensor._version != version and name not in refused:
            refused[name] = (f"it writes in place into a tensor {name}, a `functools.lru_cache`d "
                             f"function, returned at {where}: eager's cache holds the edited tensor, so "
                             f"each call starts from what the last one left, where the graph would "
                             f"compute it afresh at every step. Write into a copy (`.clone()` the "
                             f"table) or keep the running value in a buffer")
    return list(refused.values())


@contextlib.contextmanager
def cached_functions_traced(model: torch.nn.Module, found: list[str]):
    """Within: the user's cached functions are watched (module docstring)."""
    swapped, running, seen, returned, warm = [], [], set(), [], []
    for names in _places(model):
        for key, value in list(names.items()):
            if (cached := _cached_function(value)) is None or cached.cache_parameters()["maxsize"] == 0:
                continue
            if (id(names), key) in seen:
                continue
            seen.add((id(names), key))
            replacement = _rewrapped(value, _watched(cached, model, found, running, returned, warm))
            swapped.append((names, key, value, replacement, cached, cached.cache_info().currsize))
    for names, key, _, replacement, _, _ in swapped:
        names[key] = replacement
    traced = False
    try:
        yield
        traced = True
    finally:
        found += _written(returned) + (_stale(warm) if traced else [])
        for names, key, value, replacement, cached, entries in swapped:
            if names.get(key) is replacement:
                names[key] = value
            if cached.cache_info().currsize > entries:
                cached.cache_clear()   # it holds the trace's placeholders (review R4)
