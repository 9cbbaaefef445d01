"""The lists, dicts and tuples a model's modules hold, kept the same objects across torch.export.

torch.export (non-strict) snapshots every module's attributes before tracing with
`pytree.tree_map(lambda x: x, ...)`, which rebuilds each container, and puts that snapshot
back after (`_detect_attribute_assignment`), undoing what the trace wrote into them: a
module's `self.cfg = {"temp": 2.0}` is a new dict of the same items after `remat`.
Anything else holding the old dict (a hook's `functools.partial(scale, model.cfg)`, a
closure, a default argument, a callable the model holds) no longer sees the user's
`model.cfg["temp"] = 7.0`, which eager's model does: found by a review, a scheduled step
then trained on with 2.0, 0.52 and 5.24 off eager's gradients, silently, and the model
itself ran so after `remat` too.

Around the trace, each container a module holds, and each container inside it, is the
same object after, holding what it held before: what the trace wrote into one is undone in
place, as torch's snapshot undid it (a forward appending to `self.cfg["seen"]` then reading
its length kept the traced append, and trained with it at every step, silently: found by
the review of the first version of this module, which put back the objects as the trace
left them). What a trace changes at the top is the tracing hooks' to refuse
(`trace_effects`), which compare the objects the user holds.
"""

from __future__ import annotations

import collections
import contextlib

import torch
import torch.utils._pytree as pytree


#: What every module's `__dict__` holds (its parameters', buffers' and hooks' tables):
#: torch.export leaves them alone, and so does this.
_MODULES_OWN = frozenset(vars(torch.nn.Module()))


@contextlib.contextmanager
def keeping_module_containers(model: torch.nn.Module):
    """Within, torch.export may replace the containers the model's modules hold with
    copies, and the trace write into them; after (whatever it raised), each is the object
    it was, holding what it held (module docstring)."""
    held = [(module, key, value) for module in model.modules() for key, value in vars(module).items()
            if key not in _MODULES_OWN and not pytree.tree_is_leaf(value)]
    contents: list[tuple[object, list]] = []
    seen: set[int] = set()
    for _, _, value in held:
        _record(value, contents, seen)
    try:
        yield
    finally:
        for container, items in contents:
            try:
                _refill(container, items)
            except Exception:   # a container refusing in-place edits (transformers' ModelOutput)
                pass
        for module, key, value in held:
            now = vars(module).get(key, value)
            if now is not value and type(now) is type(value):
                vars(module)[key] = value


def _record(value, contents: list, seen: set[int]) -> None:
    """Append (container, its items) for `value` and every container inside it, once each."""
    if pytree.tree_is_leaf(value) or id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, dict):
        items = list(value.items())
        contents.append((value, items))
        children = [item for _, item in items]
    elif isinstance(value, (list, collections.deque)):
        children = list(value)
        contents.append((value, children))
    else:   # a tuple or another node: not written in place, but what it holds may be
        children = pytree.tree_flatten(value, is_leaf=lambda v: v is not value)[0]
    for child in children:
        _record(child, contents, seen)


def _refill(container, items: list) -> None:
    """`container` holding `items` again (its items, or (key, item) pairs for a dict), in
    place, where anything differs."""
    if isinstance(container, dict):
        now = list(container.items())
        if len(now) == len(items) and all(k is a and v is b for (k, v), (a, b) in zip(now, items)):
            return
        container.clear()
        container.update(items)
        return
    now = list(container)
    if len(now) == len(items) and all(a is b for a, b in zip(now, items)):
        return
    if isinstance(container, list):
        container[:] = items
    else:
        container.clear()
        container.extend(items)
