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
    get, put = ((owner.__getitem__, owner.__setitem__) if isinstance(owner, dict)
                else (lambda name: getattr(owner, name), lambda name, value: setattr(owner, name, value)))
    saved = {name: get(name) for name in replacements}
    for name, value in replacements.items():
        put(name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            put(name, value)
