"""Which tensors a traced forward computed from constants alone: what a lazy cache may hold.

A forward may keep tensors in a private dict of its module, filled where the dict held
nothing (`self._cache[n] = torch.cos(positions * self.inv_freq)`): a cache, which eager
reads back at later calls where the graph computes it again at every step, the same
values. But a dict filled at the first call with what the call computed from its inputs
or weights (`self._mem["q"] = feats.detach()`, a MoCo-style memory) is read back by
eager's later calls and takes another branch there (`if "q" in self._mem`), where the
graph, traced at the first call, never does: losses 0.46 off eager's from the second
step, silently (found by a review). `ConstantTensors` follows, while the forward traces,
which tensors come from factories (`arange`, `ones`), the module's buffers and the plain
tensors its modules hold, through ops on those alone: the only ones a cache may hold
(`trace_effects._changed`).
"""

from __future__ import annotations

import weakref

import torch
from torch.overrides import TorchFunctionMode


def _tensors(value, found: list) -> list:
    """The tensors in `value` (an op's arguments or result), through lists, tuples and dicts."""
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _tensors(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _tensors(item, found)
    return found


class ConstantTensors(TorchFunctionMode):
    """While active: the tensors computed from constants alone (module docstring). A
    result of an op reading any other tensor is not one, an in-place op's too (`c.add_(x)`
    writes into a constant what depends on `x`)."""

    def __init__(self):
        super().__init__()
        self._known: dict[int, weakref.ref] = {}

    def mark(self, tensors) -> None:
        """Take `tensors` as constants (a module's buffers as the forward starts)."""
        for tensor in tensors:
            self._known[id(tensor)] = weakref.ref(tensor)

    def holds(self, tensor) -> bool:
        """Whether `tensor` was computed from constants alone."""
        known = self._known.get(id(tensor))
        return known is not None and known() is tensor

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        constant = all(self.holds(t) for t in _tensors(args, _tensors(kwargs, [])))
        for tensor in _tensors(result, []):
            if constant:
                self._known[id(tensor)] = weakref.ref(tensor)
            else:
                self._known.pop(id(tensor), None)
        return result


def module_constants(model: torch.nn.Module) -> list[torch.Tensor]:
    """The buffers of `model`'s modules and the tensors they hold as plain attributes, as
    they are now (while a forward traces: the stand-ins it reads)."""
    found = []
    for module in model.modules():
        found += [t for t in vars(module).get("_buffers", {}).values() if t is not None]
        found += [t for key, t in vars(module).items() if isinstance(t, torch.Tensor)
                  and not isinstance(t, torch.nn.Parameter)]
    return found
