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
(`trace_effects`), which compare the objects the user holds; a change inside a container
held in one (`self.cfg["stats"]["calls"] += 1`, a deque in a list) is refused here: undone,
the graph kept what the trace read at every step (1.82 off, silently: found by a review).
"""

from __future__ import annotations

import collections
import contextlib

import torch
import torch.utils._pytree as pytree

from .refusals import trace_effects_error


#: What every module's `__dict__` holds (its parameters', buffers' and hooks' tables):
#: torch.export leaves them alone, and so does this.
_MODULES_OWN = frozenset(vars(torch.nn.Module()))


@contextlib.contextmanager
def keeping_module_containers(model: torch.nn.Module):
    """Within, torch.export may replace the containers the model's modules hold with
    copies, and the trace write into them; after (whatever it raised), each is the object
    it was, holding what it held (module docstring)."""
    held = [(path, module, key, value) for path, module in model.named_modules()
            for key, value in vars(module).items() if key not in _MODULES_OWN and not pytree.tree_is_leaf(value)]
    contents: list[tuple[object, list, str]] = []
    seen: set[int] = set()
    for path, _, key, value in held:
        _record(value, contents, seen, f"module attribute {key!r} of {path or '<root>'}")
    top = {id(value) for _, _, _, value in held}
    try:
        yield
        # A write into a container held inside one (`self.cfg["stats"]["calls"] += 1`), which
        # the tracing hooks, comparing the top level, do not see: undone, the graph would
        # keep what the trace read, at every step (found by a review: 1.82 off eager's loss,
        # silently). Top-level ones are theirs to refuse or allow (a lazy cache).
        written = next((where for container, items, where in contents
                        if id(container) not in top and _differs(container, items)), None)
    finally:
        for container, items, _ in contents:
            try:
                _refill(container, items)
            except Exception:   # a container refusing in-place edits (transformers' ModelOutput)
                pass
        for _, module, key, value in held:
            now = vars(module).get(key, value)
            if now is not value and type(now) is type(value):
                vars(module)[key] = value
    if written is not None:
        raise trace_effects_error(type(model).__name__, [f"it changes a list, dict or deque inside {written}"])


def _record(value, contents: list, seen: set[int], where: str) -> None:
    """Append (container, its items, `where` it is held) for `value` and every container
    inside it, once each."""
    if pytree.tree_is_leaf(value) or id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, dict):
        items = list(value.items())
        contents.append((value, items, where))
        children = [item for _, item in items]
    elif isinstance(value, (list, collections.deque)):
        children = list(value)
        contents.append((value, children, where))
    else:   # a tuple or another node: not written in place, but what it holds may be
        children = pytree.tree_flatten(value, is_leaf=lambda v: v is not value)[0]
    for child in children:
        _record(child, contents, seen, where)


def _differs(container, items: list) -> bool:
    """Whether `container` holds other than `items` (its items, or (key, item) pairs for a
    dict), by identity."""
    now = list(container.items()) if isinstance(container, dict) else list(container)
    if len(now) != len(items):
        return True
    if isinstance(container, dict):
        return not all(k is a and v is b for (k, v), (a, b) in zip(now, items))
    return not all(a is b for a, b in zip(now, items))


def _refill(container, items: list) -> None:
    """`container` holding `items` again, in place, where anything differs."""
    if not _differs(container, items):
        return
    if isinstance(container, dict):
        container.clear()
        container.update(items)
        return
    if isinstance(container, list):
        container[:] = items
    else:
        container.clear()
        container.extend(items)
