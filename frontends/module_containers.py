"""The lists, dicts and tuples a model's modules hold, kept the same objects across torch.export.

torch.export (non-strict) snapshots every module's attributes before tracing with
`pytree.tree_map(lambda x: x, ...)`, which rebuilds each container, and puts that snapshot
back after (`_detect_attribute_assignment`): a module's `self.cfg = {"temp": 2.0}` is a
new dict of the same items after `remat`. Anything else holding the old dict (a hook's
`functools.partial(scale, model.cfg)`, a closure, a default argument, a callable the
model holds) no longer sees the user's `model.cfg["temp"] = 7.0`, which eager's model
does: found by a review, a scheduled step then trained on with 2.0, 0.52 and 5.24 off
eager's gradients, silently, and the model itself ran so after `remat` too.

Around the trace, each container a module's `__dict__` held is put back in its place, the
same object, where the trace left an equal copy there. Its contents are what the forward
left in it: what a trace changes inside containers is the tracing hooks' to restore or
refuse (`trace_effects`), which compare the objects the user holds.
"""

from __future__ import annotations

import contextlib

import torch
import torch.utils._pytree as pytree


@contextlib.contextmanager
def keeping_module_containers(model: torch.nn.Module):
    """Within, torch.export may replace the containers the model's modules hold with
    copies; after (whatever it raised), each is the object it was (module docstring)."""
    held = [(module, key, value) for module in model.modules() for key, value in vars(module).items()
            if not pytree.tree_is_leaf(value)]
    try:
        yield
    finally:
        for module, key, value in held:
            now = vars(module).get(key, value)
            if now is not value and type(now) is type(value):
                vars(module)[key] = value
