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
way out (one parameter's draws come in eager's order whatever the hand-over order, as
long as nothing else draws while its step hands over: where something does, a custom
Function drawing in its backward, the draw is refused too; the hooks of the step's leaf
inputs are watched as the parameters' are: hunt71).
The hooks of two modules' steps are counted apart: each hands its gradients over before
the module below it starts (hunt71: two blocks with a noisy hook each were refused).
Hooks drawing from Python's or NumPy's global generator are watched where their code
names one (`random.gauss`, `np.random.standard_normal`: hunt71)."""

from __future__ import annotations

import functools
import hashlib
import itertools
import types

import torch

from remat_ir.ir import RematIRError
from remat_ir.torchlib.callables import describes_captured, filled, users_class
from remat_ir.torchlib.generators import object_state, same_state


class _Window:
    """One backward's hand-over (one autograd graph task): from its first step's
    `handing_over` to the end callback autograd runs once that backward is done. Kept per
    task, not per thread (autograd runs hooks on a device's thread): a backward that raised
    part-way runs no end callback, and its window must not watch the next one's hooks
    (hunt72: a later eager backward of the model was refused), nor a backward inside it (a
    reentrant checkpoint's) close it."""

    def __init__(self):
        #: Per owner (the graph of the step whose backward hands the parameter over,
        #: `owner_of`), the hooks' labels that drew.
        self.drew: dict[int, list[str]] = {}
        #: The owner of each hooked parameter (by id) in this backward: the latest step
        #: that began handing it over.
        self.owner_of: dict[int, int] = {}
        #: A digest of torch's generators' states after the last watched hook ran, or the
        #: last step began (not the 5 KB CPU state itself: held through the backward, it
        #: showed in the step's measured peak).
        self.last = _generators()
        #: Whether something other than a watched hook drew since the current step began (a
        #: custom Function drawing in its backward, another module's hook), said in the
        #: refusal. What drew before a step began drew before its hand-over, as in eager
        #: (hunt72: a noisy hook between two modules refused the one below).
        self.other = False
        #: Per hook (by id), the generators it reaches (`_own_generators`), found once per backward.
        self.generators: dict[int, list] = {}

    def note_other_draws(self) -> None:
        """Whether torch's generators moved since the last watched hook or step start."""
        now = _generators()
        if now != self.last:
            self.other = True
        self.last = now


#: The open windows by autograd graph task id (a few: those of backwards that raised stay
#: until pushed out).
_WINDOWS: dict[int, _Window] = {}


def _window() -> _Window | None:
    """The window of the backward running now, or None."""
    return _WINDOWS.get(torch._C._current_graph_task_id())


#: The attribute marking a hook wrapped by `watch`.
_WATCHED = "_remat_ir_watched"


def watch(named_parameters) -> None:
    """Wrap, once, each gradient hook of the tensors `named_parameters` gives ((label,
    tensor) pairs: "parameter 'fc.weight'", "input 'x'") so that it raises where it draws
    while a step hands over. Called as a step's forward runs and as its backward starts
    (`handing_over`: hooks registered after the forward were never watched, hunt71)."""
    for name, parameter in named_parameters:
        for table in (parameter._backward_hooks, getattr(parameter, "_post_accumulate_grad_hooks", None)):
            for key, hook in list((table or {}).items()):
                if getattr(hook, _WATCHED, False):
                    continue
                if _multi_gradient(hook):
                    table[key] = _watched(hook, _MULTI, id(parameter))
                elif not (getattr(hook, "__module__", None) or "").startswith("torch.distributed"):
                    # Not FSDP's own; torch's callables are watched (hunt72: `p.register_hook(
                    # nn.Dropout(0.3))`, gradient dropout, went by unwatched, 0.43 off).
                    table[key] = _watched(hook, name, id(parameter))


#: How a function given to `register_multi_grad_hook` is named as a drawer: one, whichever
#: tensor's gradient runs it.
_MULTI = "register_multi_grad_hook's function"


def _multi_gradient(hook) -> bool:
    """Whether `hook` is one `torch.autograd.graph.register_multi_grad_hook` put on a tensor:
    its function runs once, at the first gradient (mode "any") or once all are in ("all"),
    so its draws are its own, not the tensor's it happens to run on (hunt71: one counted
    as a parameter's own beside that parameter's noise hook drew in another order, 1.17
    off; hunt59: "all" drawing alone is eager's)."""
    code = getattr(hook, "__code__", None)
    return (code is not None and "register_multi_grad_hook" in code.co_qualname
            and code.co_filename.replace("\\", "/").endswith("torch/autograd/graph.py"))


def handing_over(named_parameters, owner) -> None:
    """Called as a step's backward starts, with its hooked parameters and leaf inputs (a
    leaf input's hook runs among the parameters' as the step hands its gradient over:
    hunt71, 0.048 off beside one parameter's) and its graph (`owner`): their hooks are
    watched until the whole backward ends (a callback autograd runs then). A later step of
    the same backward (another module, or this one called again) notes what drew in
    between."""
    named_parameters = list(named_parameters)
    watch(named_parameters)
    task = torch._C._current_graph_task_id()
    window = _WINDOWS.get(task)
    if window is None and not named_parameters:
        return   # nothing of this step's to watch (most steps: nothing is allocated)
    if window is None:
        while len(_WINDOWS) >= 8:   # backwards that raised part-way, long gone
            del _WINDOWS[next(iter(_WINDOWS))]
        window = _WINDOWS[task] = _Window()
        torch.autograd.Variable._execution_engine.queue_callback(functools.partial(_WINDOWS.pop, task, None))
    else:
        window.note_other_draws()
        window.other = False
    for _, parameter in named_parameters:
        window.owner_of[id(parameter)] = id(owner)


def _same_all(before: list, after: list) -> bool:
    return all(same_state(a, b) for a, b in zip(before, after))


def _generators() -> bytes:
    """A digest of the states of torch's default generators (the CPU's, each initialized
    CUDA device's). Not Python's nor NumPy's global ones: another thread drawing from them
    (a data-loading thread) was taken for the hook's draw, and reading NumPy's state cost
    48 us a hook (hunt60); they are watched for the hooks whose code names them
    (`_global_generators`)."""
    digest = hashlib.blake2b(torch.get_rng_state().numpy().tobytes(), digest_size=16)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for state in torch.cuda.get_rng_state_all():
            digest.update(state.numpy().tobytes())
    return digest.digest()


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
    elif not isinstance(function, (types.FunctionType, types.BuiltinFunctionType)) and callable(function) \
            and isinstance(getattr(type(function), "__call__", None), types.FunctionType):
        # A callable object (`p.register_hook(Noise())`): what it holds, and its `__call__`
        # (hunt72: its generator was unwatched, 0.458 off).
        values += list(getattr(function, "__dict__", {}).values())
        function = type(function).__call__
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
    # The items of the dicts, lists and tuples among them (`GENS["noise"]`), and the methods
    # the code names of the user's objects among them (`self.helper.noise(g)` drawing from
    # NumPy's generator: hunt72, 0.303 off).
    values += itertools.islice((item for value in list(values) if type(value) in (dict, list, tuple)
                                for item in (value.values() if isinstance(value, dict) else value)), 256)
    values += [method for value in list(values) if _users_object(value) for name in (code.co_names if code else ())
               if isinstance(method := getattr(type(value), name, None), types.FunctionType)]
    values += _global_generators(values, code)
    found = [value for value in values if object_state(value) is not None]
    if depth < 2:
        found += [inner for value in values if isinstance(value, (types.FunctionType, functools.partial))
                  and value is not hook for inner in _own_generators(value, depth + 1)]
    return list({id(generator): generator for generator in found}.values())


def _users_object(value) -> bool:
    """An instance of a class of the user's code (not a module, class or function)."""
    return (hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType, types.FunctionType,
                                                                   types.MethodType, functools.partial))
            and users_class(type(value)))


def _global_generators(values: list, code) -> list:
    """Python's and NumPy's global generators where the code names them (`random.gauss`,
    `np.random.standard_normal`, `from random import gauss`): not all hooks' (reading
    NumPy's state costs 48 us, hunt60), only those that may draw from them (hunt71: noise
    from them was 0.04 off eager's, silently)."""
    import random
    import sys

    numpy = sys.modules.get("numpy")
    names = code.co_names if code is not None else ()
    found = []
    for value in values:
        if value is random:
            found.append(random._inst)
        elif numpy is not None and (value is numpy.random or (value is numpy and "random" in names)):
            found.append(numpy.random.mtrand._rand)
        elif isinstance(getattr(value, "__self__", None), random.Random) or (
                numpy is not None and isinstance(getattr(value, "__self__", None), numpy.random.RandomState)):
            found.append(value.__self__)   # a generator's method imported by name
    return found


def _watched(hook, name: str, parameter: int):
    def watched(*args):
        window = _window()
        if window is None:
            return hook(*args)
        window.note_other_draws()
        # Found again per backward: a global rebound to a new generator after the first
        # step (noise switched on after a warm-up) was unwatched (hunt72, 0.446 off).
        own = window.generators.get(id(hook))
        if own is None:
            own = window.generators[id(hook)] = _own_generators(hook)
        before = [object_state(generator) for generator in own]
        result = hook(*args)
        after = _generators()
        if after != window.last or not _same_all(before, [object_state(generator) for generator in own]):
            names = window.drew.setdefault(window.owner_of.get(parameter, parameter), [])
            names.append(name)
            window.last = after
            if len(set(names)) > 1:   # one tensor's draws come in eager's order whatever the order
                _WINDOWS.pop(torch._C._current_graph_task_id(), None)   # the backward stops here
                raise RematIRError(
                    f"gradient hooks on {_both(names[0], name)} draw random numbers (gradient noise?). "
                    f"remat-ir's step hands the gradients over in another order than eager's autograd, so "
                    f"each hook would draw another part of the generator's stream than in eager, and the "
                    f"gradients would get other noise. {_WAY_OUT}")
            if window.other:
                _WINDOWS.pop(torch._C._current_graph_task_id(), None)
                raise _drew_beside_other(name)
        return result
    setattr(watched, _WATCHED, True)
    watched.__wrapped__ = hook
    return watched


_WAY_OUT = ("Draw it after backward() returns, in an order of your own (`for p in model.parameters(): "
            "p.grad += s * torch.randn_like(p.grad)`), or train this model without remat")


def _both(first: str, second: str) -> str:
    """"parameters 'a' and 'b'", or "parameter 'a' and input 'x'"."""
    kind, _, name = first.partition(" ")
    other_kind, _, other = second.partition(" ")
    return f"{kind}s {name} and {other}" if kind == other_kind else f"{first} and {second}"


def _drew_beside_other(name: str) -> RematIRError:
    return RematIRError(
        f"a gradient hook on {name} draws random numbers (gradient noise?), and something else drew "
        f"from torch's generator while the same step handed its gradients over: a custom autograd Function "
        f"drawing in its backward, or a hook of another module. remat-ir's step hands gradients over "
        f"in another order than eager's autograd, so the two may draw their numbers in another order than "
        f"in eager, and the gradients would get other noise. {_WAY_OUT}")
