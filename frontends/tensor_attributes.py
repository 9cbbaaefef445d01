"""Python attributes of tensors, which no trace keeps: read by the forward where the user set
them on the model's tensors, or set by the forward: refused by line.

A library or the user may keep a Python attribute on a weight (a quantization scale, a
marker such as `weight.flag` that code probes with `hasattr`), on a buffer, or on an input.
torch.export traces the forward on fake tensors that carry none of them, so a read with a
default (`getattr(w, "scale", 1.0)`) or a `hasattr` branch took what a tensor without the
attribute gives, and the graph computed with that at every step (found by a review:
outputs 0.38 off eager's from the first step, silently); a plain read (`w.scale`) failed
inside the trace, said as the forward taking another path under tracing.

While tracing, a lookup on a tensor that finds no attribute of a name one of the model's
parameters, buffers or inputs carries raises a `LoweringError` naming the attribute, the
tensor that carries it and the model's line. Nothing is installed where no tensor carries
an attribute (the common case): `Tensor.__getattr__` slows every failed lookup down.

The forward's own code setting an attribute on a tensor (an MoE attaching its
load-balancing loss to the logits, `logits.aux_loss = aux`, read by the caller with
`getattr(out, "aux_loss", 0.0)`; a flag on an input or a weight) set it on a traced tensor:
the scheduled call's outputs, inputs and weights never carried it, and the auxiliary loss
dropped out of training silently (hunt77 F15: loss 1.151 where eager's was 1.253). While
tracing, such a write by the model's code (or a library's) on a tensor the call returns
or takes is refused by line; attributes the tensor's class defines (`requires_grad`,
`grad`, `data`...) are set as before.
"""

from __future__ import annotations

import contextlib
import weakref

import torch
import torch.utils._pytree as pytree

from .errors import LoweringError
from .model_lines import model_caller, passing


def carried_attributes(model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, str]:
    """Attribute name -> the first tensor carrying it, said for the user ('parameter
    a.weight', 'input 0'), over the model's parameters and buffers and the inputs."""
    carried: dict[str, str] = {}
    tensors = [(f"parameter {name}", t) for name, t in model.named_parameters(remove_duplicate=False)]
    tensors += [(f"buffer {name}", t) for name, t in model.named_buffers(remove_duplicate=False)]
    tensors += [(f"input {pytree.keystr(path)}", t) for path, t in pytree.tree_flatten_with_path((args, kwargs))[0]
                if isinstance(t, torch.Tensor)]
    for where, tensor in tensors:
        for name in vars(tensor):
            if not name.startswith("__"):
                carried.setdefault(name, where)
    return carried


@contextlib.contextmanager
def refusing_tensor_attributes(model: torch.nn.Module, args: tuple, kwargs: dict):
    """Within, a failed lookup of an attribute the model's tensors carry raises
    `LoweringError` (module docstring)."""
    carried = carried_attributes(model, args, kwargs)
    if not carried:
        yield
        return
    name_of = type(model).__name__

    def missing(tensor, name):
        where = carried.get(name)
        if where is not None:
            line = model_caller(1)   # the model's own lookup, not torch's
            if line is not None:
                raise LoweringError(
                    f"{name_of}'s forward reads attribute {name!r} of a tensor at {line}, a Python "
                    f"attribute that {where} carries: torch.export traces the forward on tensors "
                    f"without Python attributes, so the graph would compute what a tensor without "
                    f"it gives (a default, the other branch of a hasattr). Keep the value on a "
                    f"module (an attribute, or a buffer) and read it from there")
        raise AttributeError(f"'{type(tensor).__name__}' object has no attribute '{name}'")

    torch.Tensor.__getattr__ = missing
    try:
        yield
    finally:
        del torch.Tensor.__getattr__


@contextlib.contextmanager
def refusing_tensor_attribute_writes(model: torch.nn.Module):
    """Within, the model's code setting a Python attribute, one its class does not define,
    on a tensor the call hands back or takes (an output, an input, a parameter, a buffer,
    one it stores on a module) raises `LoweringError` naming the line (module docstring). One set and read within the
    forward (`h.scale = 0.5; return h * h.scale`) is what the trace computes, and passes
    (hunt82: refused at first)."""
    name_of = type(model).__name__
    # Weak references: a hook's closure holding the trace's tensors is refused as state.
    written: dict[int, tuple[weakref.ref, str, str]] = {}   # id -> (tensor, attribute, line)
    inputs: list[weakref.ref] = []

    @passing
    def noted(tensor, name, value):
        if not hasattr(type(tensor), name) and (line := model_caller(1)) is not None:
            written.setdefault(id(tensor), (weakref.ref(tensor), name, line))
        object.__setattr__(tensor, name, value)

    def taken(module, args, kwargs):
        inputs[:] = [weakref.ref(t) for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]

    def handed_back(module, args, kwargs, output):
        members = [*model.parameters(), *model.buffers(),   # and tensors it stores on its modules
                   *(value for module in model.modules() for value in vars(module).values()
                     if isinstance(value, torch.Tensor))]
        for tensor in [*pytree.tree_leaves(output), *(ref() for ref in inputs), *members]:
            if isinstance(tensor, torch.Tensor) and (found := written.get(id(tensor))) is not None \
                    and found[0]() is tensor:
                raise LoweringError(
                    f"{name_of}'s forward sets attribute {found[1]!r} on a tensor at {found[2]}: remat-ir "
                    f"traces the forward on tensors whose Python attributes its step does not keep, so "
                    f"the outputs, inputs and weights of a scheduled call would not carry it, and code "
                    f"reading it after the call would find a default or nothing. Return the value from "
                    f"the forward instead (`return out, {found[1]}`, or in a dict)")

    torch.Tensor.__setattr__ = noted
    before = model.register_forward_pre_hook(taken, with_kwargs=True)
    after = model.register_forward_hook(handed_back, with_kwargs=True)
    try:
        yield
    finally:
        del torch.Tensor.__setattr__
        before.remove()
        after.remove()
