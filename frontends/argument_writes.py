"""Writes of the forward into the lists, dicts and sets its caller passed in: noted, then refused.

A forward may hand something back through a container argument instead of its outputs:
an auxiliary loss appended to a list the caller sums (a mixture of experts' load
balancing), a counter in a stats dict, labels popped from a batch dict. Eager's caller
sees those writes; a traced step runs the graph, which keeps no Python effect, so the
caller's list stayed empty and the step trained without the auxiliary loss, silently
(found by a review: loss 0.1230 where eager gives 0.3214). While tracing, the containers
the forward is given are compared before and after it runs (the ones it receives, which
torch.export rebuilds from the flat inputs), each write named by the argument holding it.
"""

from __future__ import annotations

import contextlib
import inspect

import torch

#: How deep containers inside containers are compared (`batch["extra"]["stats"]`).
_DEPTH = 3


def _containers(value, where: str, depth: int, found: list) -> None:
    """(where, container, shallow copy) of each list, dict or set in `value`, nested ones too,
    also inside tuples (`ctx = (None, aux_losses)`: found by a review), which cannot be
    written themselves."""
    if depth > _DEPTH or not isinstance(value, (list, dict, set, tuple)):
        return
    if not isinstance(value, tuple):
        found.append((where, value, value.copy()))
    if isinstance(value, set):
        return
    for key, item in (value.items() if isinstance(value, dict) else enumerate(value)):
        _containers(item, f"{where}[{key!r}]", depth + 1, found)


def _changed(container, before) -> str | None:
    """How `container` differs from its copy `before`, said for the user, or None."""
    if isinstance(container, set):
        return None if container == before else "items added or removed"
    if len(container) != len(before):
        return f"{len(before)} items then {len(container)}"
    if isinstance(container, dict):   # by key: one popped and put back is the same dict
        if container.keys() != before.keys():
            return f"keys {sorted(map(repr, container.keys() ^ before.keys()))} added or removed"
        pairs = ((key, container[key], before[key]) for key in container)
    else:
        pairs = ((index, now, was) for index, (now, was) in enumerate(zip(container, before)))
    for key, now, was in pairs:
        if now is not was:
            return f"item {key!r} assigned"
    return None


@contextlib.contextmanager
def noting_argument_writes(model: torch.nn.Module, found: list[str]):
    """Within, each write of the model's forward into a container argument appends an
    effect to `found` (module docstring)."""
    try:
        names = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        names = []
    given: list = []

    def before(module, args, kwargs):
        given.clear()
        for index, arg in enumerate(args):
            name = names[index] if index < len(names) and names[index] not in ("args", "kwargs") else f"{index}"
            _containers(arg, f"argument {name}", 0, given)
        for name, arg in kwargs.items():
            _containers(arg, f"argument {name}", 0, given)

    def after(module, args, kwargs, output):
        for where, container, was in given:
            if (how := _changed(container, was)) is not None:
                found.append(f"it writes into the {type(container).__name__} of its {where} ({how}), which "
                             f"eager's caller sees and a graph does not keep: return what it adds as an "
                             f"output instead (an auxiliary loss among the outputs)")
                break

    starts = model.register_forward_pre_hook(before, with_kwargs=True)
    ends = model.register_forward_hook(after, with_kwargs=True)
    try:
        yield
    finally:
        starts.remove()
        ends.remove()
