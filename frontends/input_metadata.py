"""How the caller made an input tensor, read by the forward: refused by line.

A forward may branch on an input's autograd metadata or its place in memory: whether it
is a leaf (`x.is_leaf`, `x.grad_fn is None`), a view (`x._base`, `x._is_view()`), where
it starts in its storage (`x.storage_offset()`), how often it was written (`x._version`).
A call's signature names an input's shape, dtype, layout and whether it requires a
gradient, not these: a submodule's input is a leaf at `remat`'s example and a layer's
output in training, so naming them would plan every submodule twice. The trace holds the
branch its example took, so a call whose input was made otherwise ran that branch (found
by a review: a forward taking `x.contiguous()` only for a view ran 2.97 off eager's
gradients at calls with a view, silently).

While tracing, such a read of one of the caller's input tensors by the model's own code
raises a `LoweringError` naming the attribute, the line and what to do. `is_leaf` and
`grad_fn` are refused only for an input that requires a gradient: one that does not is
always a leaf, and whether it requires one is in the signature. `storage_offset()`,
`_version` and `_base` are refused through a tensor sharing an input's memory too
(`x.detach()`, `x[:]`): it answers as the input does. Reads by torch's own code (its tracing reads these
of every tensor) go through.
"""

from __future__ import annotations

import contextlib

import torch
import torch.utils._pytree as pytree

from remat_ir.torchlib.types import argument_name, storage_id

from .errors import LoweringError
from .model_lines import model_caller

#: Tensor attributes read as properties, and whether only an input requiring a gradient
#: is refused them (one that requires none is always a leaf).
_PROPERTIES = {"is_leaf": True, "grad_fn": True, "_base": False, "_version": False}
#: Tensor methods whose answer depends on how the caller made the tensor.
_METHODS = ("storage_offset", "_is_view")
#: Those whose answer a tensor sharing the input's memory (a view, a detached alias)
#: inherits from the input: where it starts in it, its writes' counter, and its base
#: (`x.view(-1)._base is x` where x is no view).
_SHARED = frozenset({"storage_offset", "_version", "_base"})


@contextlib.contextmanager
def refusing_input_metadata(model: torch.nn.Module):
    """Within, the model's own code reading `_PROPERTIES` or calling `_METHODS` of one of
    the tensors the model is called with raises `LoweringError` (module docstring)."""
    inputs: dict[int, tuple[str, bool]] = {}   # id -> (name said, requires a gradient)
    storages: dict[int, tuple[str, bool]] = {}   # the inputs' storages, alike

    def note(module, args, kwargs):
        for path, leaf in pytree.tree_flatten_with_path((args, kwargs))[0]:
            if isinstance(leaf, torch.Tensor):
                inputs.setdefault(id(leaf), (argument_name(path), leaf.requires_grad))
                if (storage := storage_id(leaf)) is not None:
                    storages.setdefault(storage, inputs[id(leaf)])

    def refuse(tensor, name: str, grad_only: bool, shown: str):
        found = inputs.get(id(tensor))
        if found is None and (name not in _SHARED or not storages):
            return
        line = model_caller(2)   # the model's own read, not torch's
        if line is None:
            return
        if found is None:
            # Read through another tensor of the input's memory (`x.detach()`, `x[:]`),
            # whose answer is the input's too (found by a review: 0.15 off, silently).
            storage = storage_id(tensor)
            found = storages.get(storage) if storage is not None else None
        if found is not None and (found[1] or not grad_only):
            raise LoweringError(
                f"{type(model).__name__}'s forward reads {shown} of its input {found[0]} at {line}: "
                f"a call's signature does not name how the caller made an input (a leaf or "
                f"not, a view or not, where it starts in memory), so the graph traced for this "
                f"call's answer would run at calls whose answer differs. Decide it outside the "
                f"model and pass the answer as an argument (a bool: each value is planned apart), "
                f"or take one path for every input (`x.contiguous()` copies nothing where x "
                f"already is contiguous)")

    def watched_property(name: str, grad_only: bool):
        original = getattr(torch._C.TensorBase, name)

        def read(self):
            refuse(self, name, grad_only, f"`.{name}`")
            return original.__get__(self)
        return property(read)

    def watched_method(name: str):
        original = getattr(torch._C.TensorBase, name)

        def call(self, *args, **kwargs):
            refuse(self, name, False, f"`.{name}()`")
            return original(self, *args, **kwargs)
        return call

    replaced = {name: watched_property(name, grad_only) for name, grad_only in _PROPERTIES.items()}
    replaced.update({name: watched_method(name) for name in _METHODS})
    own = {name: torch.Tensor.__dict__[name] for name in replaced if name in torch.Tensor.__dict__}
    handle = model.register_forward_pre_hook(note, with_kwargs=True, prepend=True)
    for name, attribute in replaced.items():
        setattr(torch.Tensor, name, attribute)
    try:
        yield
    finally:
        handle.remove()
        for name in replaced:   # as they were: torch.Tensor's own, or TensorBase's
            if name in own:
                setattr(torch.Tensor, name, own[name])
            else:
                delattr(torch.Tensor, name)
