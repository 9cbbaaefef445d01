"""The user's `functools.lru_cache`d functions, run uncached while a forward is traced.

A forward may take a table from a cached function (`causal_mask(n)`, a rotary table per
length). Through the cache, the trace met one of two things, by the order of calls
before `remat`:
- a miss: the function's ops traced into the graph, which computes the table at every
  step. Right for a constant table; for one drawn at random (`torch.randn(n, d)` cached
  per length) or computed from the trained weights, eager computes it once and reads it
  back, the graph at every step: other numbers from the second step, silently;
- a hit on what an eager call had cached (an evaluation at that length, the model run
  once before `remat`): a real tensor, refused as one no parameter, buffer or input holds.
  Whether a length trained depended on whether an evaluation met it first (hunt80 F6).

While traced, each such function (in the user's globals, closures and classes, and the
model's classes: `outside_state.namespaces`) runs its body uncached, its cache neither
read nor filled. `CallDerived` follows what the body computes from its tensor arguments,
the trained parameters and random draws: a result holding such a value is refused by
line (eager would not compute it again); any other result is a constant the graph
computes at every step, the same values eager's cache holds. Running the body uncached
for every hit, without this check, drew a cached random table at every step (hunt82 F7).
"""

from __future__ import annotations

import contextlib
import functools

import torch

from . import outside_state
from .constant_tensors import CallDerived, call_sources, tensors_in
from .model_lines import model_caller


def _cached_function(value):
    """The `lru_cache` wrapper `value` is, or wraps as a static or class method, else None."""
    inner = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
    if isinstance(inner, functools._lru_cache_wrapper) and callable(getattr(inner, "__wrapped__", None)):
        return inner
    return None


def _uncached(cached, model: torch.nn.Module, found: list[str], running: list):
    """`cached`'s body, checked; a call within another (a memoized recursion) goes
    through the cache, which an uncached recursion would make exponential."""
    function = cached.__wrapped__

    @functools.wraps(function)
    def call(*args, **kwargs):
        if running:
            return cached(*args, **kwargs)
        derived = CallDerived()
        derived.mark(call_sources(model, (args, kwargs)))
        running.append(function)
        try:
            with derived:
                result = function(*args, **kwargs)
        finally:
            running.pop()
        if any(derived.derived(tensor) for tensor in tensors_in(result, [])):
            where = model_caller(1) or "the forward"
            found.append(f"it takes a tensor from {function.__qualname__}, a `functools.lru_cache`d "
                         f"function, at {where}, which computes it from random draws, its tensor "
                         f"arguments or the trained weights: eager computes it once and reads it back "
                         f"from the cache, the graph would compute it again at every step. Compute it "
                         f"in the forward without the cache, or once outside it (a buffer made in "
                         f"`__init__`)")
        return result

    return call


@contextlib.contextmanager
def cached_functions_traced(model: torch.nn.Module, found: list[str]):
    """Within: the user's cached functions run uncached, checked (module docstring)."""
    swapped, running = [], []
    for _, names in outside_state.namespaces(model):
        for key, value in list(names.items()):
            if (cached := _cached_function(value)) is None:
                continue
            replacement = _uncached(cached, model, found, running)
            if isinstance(value, (staticmethod, classmethod)):
                replacement = type(value)(replacement)
            swapped.append((names, key, value, replacement))
    for names, key, _, replacement in swapped:
        names[key] = replacement
    try:
        yield
    finally:
        for names, key, value, replacement in swapped:
            if names.get(key) is replacement:
                names[key] = value
