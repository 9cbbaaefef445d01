"""Gradient hooks on parameters that draw random numbers, refused as they draw.

A step hands its parameters' gradients to autograd in the order its plan produces them,
which may differ from eager's (weights before biases, the first layer before the last):
hooks see eager's gradients, in another order. A hook drawing from torch's generator
(gradient noise, `p.register_hook(lambda g: g + s * torch.randn_like(g))`, or a noisy
update in `register_post_accumulate_grad_hook`) then drew each parameter's noise from
another part of the generator's stream: parameters 7.3e-3 off eager's after two steps,
the generator's state at the end equal, silently (found by hunt59). While a step's
backward hands gradients over (`handing_over`), each parameter hook is watched
(`watch`): one that moves a generator raises, naming the parameter and the way out."""

from __future__ import annotations

import torch

from remat_ir.ir import RematIRError

#: Whether a step's backward is handing gradients over: autograd runs hooks on its own
#: threads (a device's), so not a thread's own.
_HANDING_OVER = [False]
#: The attribute marking a hook wrapped by `watch`.
_WATCHED = "_remat_ir_watched"


def watch(named_parameters) -> None:
    """Wrap, once, each gradient hook of the parameters `named_parameters` gives ((name,
    parameter) pairs) so that it raises where it draws while a step hands over. Called as a
    step's forward runs, when no backward hands over (one that raised ran no end callback)."""
    _HANDING_OVER[0] = False
    for name, parameter in named_parameters:
        for table in (parameter._backward_hooks, getattr(parameter, "_post_accumulate_grad_hooks", None)):
            for key, hook in list((table or {}).items()):
                if not getattr(hook, _WATCHED, False):
                    table[key] = _watched(hook, name)


def handing_over() -> None:
    """Called as a step's backward starts: parameter hooks are watched until the whole
    backward ends (a callback autograd runs then)."""
    if not _HANDING_OVER[0]:
        _HANDING_OVER[0] = True
        torch.autograd.Variable._execution_engine.queue_callback(_handed_over)


def _handed_over() -> None:
    _HANDING_OVER[0] = False


def _generators() -> list[torch.Tensor]:
    states = [torch.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states += torch.cuda.get_rng_state_all()
    return states


def _watched(hook, name: str):
    def watched(*args):
        if not _HANDING_OVER[0]:
            return hook(*args)
        before = _generators()
        result = hook(*args)
        if any(not torch.equal(a, b) for a, b in zip(before, _generators())):
            _HANDING_OVER[0] = False   # the backward stops here: no end callback runs
            raise RematIRError(
                f"a gradient hook on parameter {name!r} draws random numbers (gradient noise?). "
                f"remat-ir's step hands the parameters' gradients over in another order than eager's "
                f"autograd, so each hook would draw another part of the generator's stream than in "
                f"eager, and every parameter would get other noise. Draw it after backward() returns, "
                f"in an order of your own (`for p in model.parameters(): p.grad += s * "
                f"torch.randn_like(p.grad)`), or train this model without remat")
        return result
    setattr(watched, _WATCHED, True)
    watched.__wrapped__ = hook
    return watched
