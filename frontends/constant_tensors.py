"""Which tensors a traced forward computed from what a call brings: what a lazy cache may
not hold.

A forward may keep tensors in a private dict of its module, filled where the dict held
nothing (`self._cache[n] = torch.cos(positions * self.inv_freq)`): a cache, which eager
reads back at later calls where the graph computes it again at every step, the same
values. But a dict filled at the first call with what the call computed from its inputs
or weights (`self._mem["q"] = feats.detach()`, a MoCo-style memory) is read back by
eager's later calls and takes another branch there (`if "q" in self._mem`), where the
graph, traced at the first call, never does: losses 0.46 off eager's from the second
step, silently (found by a review). `CallDerived` follows, while the forward traces, the
storages holding values computed from the call's inputs, the trained parameters, random
draws, and buffers a norm's running statistics update from its input, through every op
reading their values and every write into a tensor (`mem[:] = h`, a view's `copy_`):
such a value in a cache is refused (`trace_effects._changed`). Anything else is taken as
constant: factories, other buffers, frozen parameters, a global or numpy table, and ops
reading only the dtype, device or shape of a derived tensor (`cache.to(x)`,
`zeros_like(x)`, `x.new_ones(n)`): refusing those was a review's finding on the first,
constant-following, version.
"""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode


def tensors_in(value, found: list) -> list:
    """The tensors in `value` (an op's arguments or result), through lists, tuples and dicts."""
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            tensors_in(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            tensors_in(item, found)
    return found


#: Ops whose result depends on their tensor arguments' metadata alone (dtype, device,
#: shape), or on none: derived from nothing the call brings.
_METADATA_ONLY = frozenset({"zeros_like", "ones_like", "empty_like", "full_like", "new_zeros", "new_ones",
                            "new_empty", "new_full", "new_tensor", "size", "dim", "numel", "stride"})
#: Ops whose result takes the values of their first argument only (the others give a dtype
#: or device: `cache.to(x)`, `cache.type_as(x)`).
_FIRST_VALUES = frozenset({"to", "type_as", "type"})
#: Norms whose running statistics (their 2nd and 3rd arguments) the call's input updates.
_STATISTICS = frozenset({"batch_norm", "instance_norm"})
#: Random draws: a cache of one would be drawn again at every step of the graph.
_RANDOM = frozenset({"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "normal",
                     "normal_", "bernoulli", "bernoulli_", "multinomial", "poisson", "dropout", "dropout_",
                     "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout", "uniform_",
                     "exponential_", "geometric_", "cauchy_", "log_normal_", "random_", "rrelu", "rrelu_",
                     "gumbel_softmax", "binomial", "_standard_gamma", "_sample_dirichlet"})
#: Python's in-place operators on a tensor (`x += y`, `x[i] = y`), besides the `op_` methods.
_WRITING = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                      "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__",
                      "__imatmul__"})


def _writes(name: str) -> bool:
    """Whether the op named `name` writes into its first argument."""
    return name in _WRITING or (name.endswith("_") and not name.startswith("_"))


def _storage(tensor: torch.Tensor):
    try:
        return StorageWeakRef(tensor.untyped_storage())
    except (RuntimeError, NotImplementedError):   # a tensor without storage: by itself
        return None


class CallDerived(TorchFunctionMode):
    """While active: the storages of tensors computed from what a call brings (module
    docstring). `mark` adds the call's sources as the forward starts."""

    def __init__(self):
        super().__init__()
        self._derived: set = set()

    def mark(self, tensors) -> None:
        for tensor in tensors:
            if (storage := _storage(tensor)) is not None:
                self._derived.add(storage)

    def derived(self, tensor) -> bool:
        """Whether `tensor` holds values computed from what a call brings."""
        storage = _storage(tensor)
        return storage is None or storage in self._derived

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name in _METADATA_ONLY:
            return result
        if name in _FIRST_VALUES:
            reads = [args[0]] if args and isinstance(args[0], torch.Tensor) else []
        else:
            reads = tensors_in(args, tensors_in(kwargs, []))
        if name in _RANDOM or any(self.derived(t) for t in reads):
            written = [args[0]] if args and isinstance(args[0], torch.Tensor) and _writes(name) else []
            written = tensors_in(kwargs.get("out"), written)
            if name in _STATISTICS and kwargs.get("training", args[5] if len(args) > 5 else False):
                written += [t for t in (*args[1:3], kwargs.get("running_mean"), kwargs.get("running_var"))
                            if isinstance(t, torch.Tensor)]
            self.mark(tensors_in(result, written))
        return result


def call_sources(model: torch.nn.Module, inputs: tuple) -> list[torch.Tensor]:
    """What a call brings as the forward starts: its tensor inputs (those the root's
    pre-hook is given) and the parameters training updates."""
    return tensors_in(inputs, []) + [p for p in model.parameters() if p.requires_grad]
