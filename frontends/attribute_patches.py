"""Attributes replaced for the length of a block and put back after, whatever it raises.

Tracing changes what some of torch's and transformers' functions do while it runs
(`transformers_masks`: the mask decisions; `autocast_blocks`: `torch.autocast`'s cache
setting; `distributed_calls`: the rank and the collectives): one way to do it, so that
each puts back exactly what it replaced."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def replaced(owner, replacements: dict):
    """Within: `owner`'s attributes named in `replacements` (a module's, a class's) are
    those; put back after."""
    saved = {name: getattr(owner, name) for name in replacements}
    for name, value in replacements.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(owner, name, value)
