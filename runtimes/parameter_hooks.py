"""Gradient hooks on parameters that draw random numbers, refused as they draw.

A step hands its parameters' gradients to autograd in the order its plan produces them,
which may differ from eager's (weights before biases, the first layer before the last):
hooks see eager's gradients, in another order. A hook drawing from torch's generator
(gradient noise, `p.register_hook(lambda g: g + s * torch.randn_like(g))`, or a noisy
update in `register_post_accumulate_grad_hook`) then drew each parameter's noise from
another part of the generator's stream: parameters 7.3e-3 off eager's after two steps,
the generator's state at the end equal, silently (found by hunt59). While a step's
backward hands gradients over (`handing_over`), each parameter hook is watched
(`watch`): where the hooks of two parameters move a generator (torch's default one, or
one of the user's they reach: `_own_generators`), the second raises, naming both and the
way out (one parameter's draws come in eager's order whatever the hand-over order)."""

from __future__ import annotations

import functools
import types

import torch

from remat_ir.ir import RematIRError
from remat_ir.torchlib.callables import describes_captured, filled
from remat_ir.torchlib.generators import object_state, same_state

#: Whether a step's backward is handing gradients over: autograd runs hooks on its own
#: threads (a device's), so not a thread's own.
_HANDING_OVER = [False]
#: The parameters whose hooks drew while the current backward hands over.
_DREW: list[str] = []
#: The attribute marking a hook wrapped by `watch`.
_WATCHED = "_remat_ir_watched"


def watch(named_parameters) -> None:
    """Wrap, once, each gradient hook of the parameters `named_parameters` gives ((name,
    parameter) pairs) so that it raises where it draws while a step hands over. Called as a
    step's forward runs, when no backward hands over (one that raised ran no end callback)."""
    _HANDING_OVER[0] = False
    _DREW.clear()
    for name, parameter in named_parameters:
        for table in (parameter._backward_hooks, getattr(parameter, "_post_accumulate_grad_hooks", None)):
            for key, hook in list((table or {}).items()):
                # Not torch's own (`register_multi_grad_hook`'s, whose function runs once every
                # gradient is in, in the order of its tensors: hunt59).
                if not getattr(hook, _WATCHED, False) and not getattr(hook, "__module__", "").startswith("torch."):
                    table[key] = _watched(hook, name)


def handing_over() -> None:
    """Called as a step's backward starts: parameter hooks are watched until the whole
    backward ends (a callback autograd runs then)."""
    if not _HANDING_OVER[0]:
        _HANDING_OVER[0] = True
        _DREW.clear()
        torch.autograd.Variable._execution_engine.queue_callback(_handed_over)


def _handed_over() -> None:
    _HANDING_OVER[0] = False


def _generators() -> list:
    """The states of torch's default generators (the CPU's, each initialized CUDA
    device's). Not Python's nor NumPy's global ones: another thread drawing from them
    (a data-loading thread) was taken for the hook's draw, and reading NumPy's state cost
    48 us a hook (hunt60)."""
    states: list = [torch.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states += torch.cuda.get_rng_state_all()
    return states


def _own_generators(hook, depth: int = 0) -> list:
    """The random generators of the user's a hook reaches: in its closure, its defaults,
    the globals its code names, a bound method's object or a partial's arguments, and so
    in the functions among those, 3 deep (a `torch.Generator`, NumPy's `default_rng()` or
    `RandomState`, a `random.Random`; found by hunt59: noise a helper drew from one was
    silent)."""
    values: list = []
    function = hook
    if isinstance(function, functools.partial):
        values += [*function.args, *function.keywords.values()]
        function = function.func
    if isinstance(function, types.MethodType):
        values += list(getattr(function.__self__, "__dict__", {}).values())
        function = function.__func__
    code = getattr(function, "__code__", None)
    if code is not None and depth and not describes_captured(function, code):
        return []   # a library's function: its generators are not the user's (and torch's globals are many)
    if code is not None:
        values += [cell.cell_contents for cell in function.__closure__ or () if filled(cell)]
        values += list(function.__defaults__ or ())
        values += [function.__globals__[name] for name in code.co_names if name in function.__globals__]
    # And the generators the objects among those hold as attributes (`self.gen` of a
    # module whose method the hook calls, `cfg.gen`: hunt60). Not a Python module's nor a
    # class's: the `torch` a hook names held thousands, and an optimizer step in the hooks
    # took 260 s at the first call (found timing the suite).
    values += [held for value in values if hasattr(value, "__dict__")
               and not isinstance(value, (type, types.ModuleType))
               and not callable(getattr(value, "__dict__", None)) for held in list(vars(value).values())]
    found = [value for value in values if object_state(value) is not None]
    if depth < 2:
        found += [inner for value in values if isinstance(value, (types.FunctionType, functools.partial))
                  and value is not hook for inner in _own_generators(value, depth + 1)]
    return list({id(generator): generator for generator in found}.values())


def _watched(hook, name: str):
    own = _own_generators(hook)

    def states() -> list:
        return _generators() + [object_state(generator) for generator in own]

    def watched(*args):
        if not _HANDING_OVER[0]:
            return hook(*args)
        before = states()
        result = hook(*args)
        if not all(same_state(a, b) for a, b in zip(before, states())):
            _DREW.append(name)
            if len(set(_DREW)) > 1:   # one parameter's draws come in eager's order whatever the order
                _HANDING_OVER[0] = False   # the backward stops here: no end callback runs
                first, *_ = dict.fromkeys(_DREW)
                raise RematIRError(
                    f"gradient hooks on parameters {first!r} and {name!r} draw random numbers (gradient "
                    f"noise?). remat-ir's step hands the parameters' gradients over in another order than "
                    f"eager's autograd, so each hook would draw another part of the generator's stream than "
                    f"in eager, and the parameters would get other noise. Draw it after backward() returns, "
                    f"in an order of your own (`for p in model.parameters(): p.grad += s * "
                    f"torch.randn_like(p.grad)`), or train this model without remat")
        return result
    setattr(watched, _WATCHED, True)
    watched.__wrapped__ = hook
    return watched
