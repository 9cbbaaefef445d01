"""A custom backward computing on a tensor it reads from outside the trace.

A custom backward (an `autograd.Function`'s, or a `torch.library` op's
`register_autograd`) that reads a global or a closure's tensor, which its forward did not
save, is refused by FakeTensor where that tensor meets a traced one (`g * SCALE`). But
one combined first with Python numbers only (`g * (SCALE * 2)`, `SCALE / 100`) is
computed for real while AOTAutograd traces: its value then is a constant of the joint
graph, and a later change of the tensor (a gradient reversal's weight annealed in place)
is trained on with the traced value, 0.15 off eager's gradients, silently (found while
checking note 120's list). `outside_tensors_refused` raises `OutsideTensorRead` where the
user's code runs a torch function on such a tensor while the joint graph is traced, for
the frontend to refuse naming the op and the way out (`ctx.save_for_backward`). A
Function's backward runs inside it (`autograd_functions`); a custom op's registered
backward, within `custom_op_backwards_watched`.
"""

from __future__ import annotations

import contextlib
import functools
import sys

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from .model_lines import is_model_file


class OutsideTensorRead(RuntimeError):
    """The user's code ran a torch function on a real tensor while the joint graph was
    traced; `writes`: in place into it (a statistic: said as a write by the frontend)."""

    def __init__(self, message: str, writes: bool):
        super().__init__(message)
        self.writes = writes


class outside_tensors_refused(TorchFunctionMode):   # noqa: N801 - used as a context, like torch's modes
    """Within (the joint graph's trace): a torch function the user's code calls on a plain
    tensor, one that is neither traced (fake, functional) nor made in the trace, raises
    `OutsideTensorRead`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) not in _METADATA \
                and _users_file(sys._getframe(1).f_code.co_filename):
            for leaf in tree_leaves((args, kwargs)):
                if type(leaf) in (torch.Tensor, torch.nn.Parameter) and not traced(leaf):
                    value = leaf.item() if leaf.numel() == 1 else "..."
                    name = getattr(func, "__name__", str(func))
                    writes = name.endswith("_") and not name.startswith("_") and args and args[0] is leaf
                    raise OutsideTensorRead(f"{name} {'writes into' if writes else 'of'} tensor({value}, "
                                            f"size={tuple(leaf.shape)})", bool(writes))
        return func(*args, **kwargs)


#: What reads a tensor's metadata, not its values (hunt69: a backward reading a global's
#: `.dtype`, `.shape`, `.size(0)` or `.numel()` was refused). `__get__`: an attribute
#: (`W.dtype`, `W.T`); a tensor it gives is refused where an op computes with it.
_METADATA = frozenset({"__get__", "size", "dim", "ndimension", "numel", "nelement", "stride",
                       "is_contiguous", "element_size", "is_floating_point", "is_complex",
                       "get_device", "__len__", "storage_offset", "type"})


@functools.lru_cache(maxsize=512)
def _users_file(filename: str) -> bool:
    return is_model_file(filename)


def traced(tensor) -> bool:
    """Whether `tensor` (or None) is one the trace follows (fake, functional, meta)."""
    return isinstance(tensor, torch.Tensor) and (
        torch._subclasses.fake_tensor.is_fake(tensor) or torch._is_functional_tensor(tensor)
        or tensor.device.type == "meta")


#: The note an `OutsideTensorRead` raised in a custom op's backward carries
#: (`autograd_functions.op_backward_of`).
OP_NOTE = "raised in the backward of custom op "


@contextlib.contextmanager
def custom_op_backwards_watched(definitions):
    """Within: the backward and the setup_context each of `definitions` registered
    (`torch.library.custom_op`s' `CustomOpDef`s, whose `_backward_fn` and
    `_setup_context_fn` torch's autograd kernel looks up at each call) run inside
    `outside_tensors_refused` while traced. hunt69: a setup_context keeping
    `float(STEPS / 100)` on ctx from a global tensor was traced once, 2e-3 off."""
    wrapped = []
    for definition in definitions:
        backward, setup = definition._backward_fn, definition._setup_context_fn
        if backward is None:
            continue
        name = definition._qualname

        def watched(ctx, *grads, backward=backward, name=name):
            watching = outside_tensors_refused() if any(map(traced, grads)) else contextlib.nullcontext()
            with _noted_as(name), watching:
                return backward(ctx, *grads)

        def watched_setup(*args, setup=setup, name=name, **kwargs):
            traced_call = any(traced(t) for t in tree_leaves((args, kwargs)))
            with _noted_as(name), outside_tensors_refused() if traced_call else contextlib.nullcontext():
                return setup(*args, **kwargs)

        wrapped.append((definition, backward, setup))
        definition._backward_fn = watched
        if setup is not None:
            definition._setup_context_fn = watched_setup
    try:
        yield
    finally:
        for definition, backward, setup in wrapped:
            definition._backward_fn, definition._setup_context_fn = backward, setup


@contextlib.contextmanager
def _noted_as(name: str):
    """An `OutsideTensorRead` raised within carries the custom op's name (`OP_NOTE`)."""
    try:
        yield
    except OutsideTensorRead as exc:
        exc.add_note(f"{OP_NOTE}{name}")
        raise
