"""Attributes replaced for the length of a block and put back after, whatever it raises.

Tracing changes what some of torch's and transformers' functions do while it runs
(`transformers_masks`: the mask decisions; `autocast_blocks`: `torch.autocast`'s cache
setting; `distributed_calls`: the rank and the collectives): one way to do it, so that
each puts back exactly what it replaced."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def replaced(owner, replacements: dict):
    """Within: `owner`'s attributes named in `replacements` (a module's, a class's), or
    its items where `owner` is a dict (a module's namespace, `function.__globals__`), are
    those; put back after."""
    if isinstance(owner, dict):
        get, put = owner.__getitem__, owner.__setitem__
    elif isinstance(owner, type):
        # A class's own entry, as stored: read through the class, a C++ method of a
        # pybind class (`ProcessGroup.rank`) is its unbound function, which put back
        # lost its binding and every `group.rank()` after raised. One it inherits is
        # taken away again.
        def get(name):
            return owner.__dict__.get(name, _INHERITED)

        def put(name, value):
            if value is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
    else:
        def get(name):
            return getattr(owner, name)

        def put(name, value):
            setattr(owner, name, value)
    saved = {name: get(name) for name in replacements}
    for name, value in replacements.items():
        put(name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            put(name, value)


#: A class attribute `replaced` found on a base class, not the class's own.
_INHERITED = object()
